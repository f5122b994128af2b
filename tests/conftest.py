"""Shared pytest set-up."""
# With hypothesis's pytest plugin loaded, a failing notebook crashes pytest's summary on CPython
# 3.11.7 (SystemError: AST constructor recursion depth mismatch); importing it first avoids that
# (../shared/STACK.md).
import hypothesis  # noqa: F401
