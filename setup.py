"""Builds kvcap's compiled replay cores, V1 and V0 (everything else is in pyproject.toml).

`-ffp-contract=off`: no fused multiply-adds, so the C cost model rounds exactly like the Python one
(the differential tests compare step durations bit for bit).
"""
from setuptools import Extension, setup

_ARGS = ["-O2", "-std=c11", "-ffp-contract=off"]
# optional: without a C compiler the install still succeeds and replays run on the Python loop
# (tests/test_v1_core.py::test_core_is_built fails loudly, so CI notices).
setup(ext_modules=[Extension(f"replay.engine.{v}._core",
                             sources=[f"replay/engine/{v}/_core.c"],
                             depends=["replay/engine/kvcore.h", "replay/engine/v1/_offload.h",
                                      "replay/engine/v1/_connector.h"],
                             extra_compile_args=_ARGS, optional=True)
                   for v in ("v1", "v0")])
