"""Builds kvcap's compiled replay core (everything else is in pyproject.toml).

`-ffp-contract=off`: no fused multiply-adds, so the C cost model rounds exactly like the Python one
(the differential tests compare step durations bit for bit).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("replay.v1._core", sources=["replay/v1/_core.c"],
                             extra_compile_args=["-O2", "-std=c11", "-ffp-contract=off"])])
