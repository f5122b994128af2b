"""Numbers as kvcap prints them, in the terminal, the report and the plan's sentences.

One spelling everywhere: durations in ms below 1 s and in s above, thousands separators, never
scientific notation (`1.01e+03 s` was a TTFT), and two bounds that differ are never printed
alike (`fits up to ×0.14 (fails at ×0.14)`): `distinct` adds digits until they differ.
Pure string formatting: imports nothing of kvcap, so every layer can use it.
"""
from __future__ import annotations

import math

NBSP = "\u00a0"


def seconds(v: float | None, *, missing: str = "-", nbsp: bool = False) -> str:
    """`v` seconds: '173 ms', '12.3 ms', '0.42 ms', '8.77 s', '378.1 s', '1,010 s'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return missing
    sep = NBSP if nbsp else " "
    a = abs(v)
    if a < 0.9995:                      # what would print as 1,000 ms is 1.00 s
        ms = v * 1000
        digits = 0 if abs(ms) >= 99.95 else 1 if abs(ms) >= 9.995 else 2
        return f"{ms:,.{digits}f}{sep}ms"
    digits = 2 if a < 99.995 else 1 if a < 999.95 else 0
    return f"{v:,.{digits}f}{sep}s"


def limit(v: float) -> str:
    """A threshold as the user wrote it, in the same units: '200 ms', '5 s', '1.5 s'."""
    return f"{v * 1000:,.{_places(v * 1000)}f} ms" if abs(v) < 1 else f"{v:,.{_places(v)}f} s"


def _places(v: float) -> int:
    """Decimals that show `v` without trailing zeros (at most 3)."""
    return next((d for d in range(4) if round(v, d) == round(v, 3)), 3)


def number(v: float | int | None, *, digits: int = 3, missing: str = "-") -> str:
    """A plain quantity to about `digits` significant digits, with thousands separators, without
    an exponent or trailing zeros: 12,345 / 123 / 1.23 / 0.1 / 0.00123."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return missing
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if v == 0 or math.isinf(v):
        return f"{v:g}"
    magnitude = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{v:,.{decimals}f}"
    # As %g would (0.1, not 0.1000), without its exponent.
    return text.rstrip("0").rstrip(".") if "." in text else text


def distinct(a: float, b: float, *, digits: int = 2, most: int = 6) -> tuple[str, str]:
    """`a` and `b` with `digits` decimals, or more until the two differ (up to `most`)."""
    for d in range(digits, most + 1):
        sa, sb = f"{a:,.{d}f}", f"{b:,.{d}f}"
        if sa != sb or a == b:
            return sa, sb
    return sa, sb
