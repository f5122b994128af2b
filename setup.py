"""Builds kvcap's compiled replay cores, V1 and V0 (everything else is in pyproject.toml).

`-ffp-contract=off`: no fused multiply-adds, so the C cost model rounds exactly like the Python one
(the differential tests compare step durations bit for bit).
"""
from setuptools import Extension, setup

_ARGS = ["-O2", "-std=c11", "-ffp-contract=off"]
setup(ext_modules=[Extension("replay.v1._core", sources=["replay/v1/_core.c"],
                             extra_compile_args=_ARGS),
                   Extension("replay.v0._core", sources=["replay/v0/_core.c"],
                             extra_compile_args=_ARGS)])
