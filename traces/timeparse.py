"""Arrival times: source timestamps -> Float64 seconds relative to the first request.

Owns the time rules: numeric times with a unit (`s`, `ms`, `us`, `ns`), text timestamps with a
strftime-style format (chrono syntax; `%.f` takes 0-9 fractional digits, so Azure's 7 digits keep
their full 100 ns precision), "auto" detection among the ISO-like layouts real traces use (Azure
2023 without zone, Azure 2024 with `+00:00`, ISO `T...Z`), and native Parquet datetimes. Zone-aware
times are compared in UTC. Must not import replay/ or capacity/.
"""
from __future__ import annotations

import polars as pl

from traces.sources import Source

# Units per second; dividing (not multiplying by 1e-3) keeps e.g. 3536999 ms -> 3536.999 s exact.
TIME_UNITS_S: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}

# Tried in order on the first value when the format is "auto".
AUTO_TIMESTAMP_FORMATS: tuple[str, ...] = (
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f%#z",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f%#z",
)


def relative_seconds(src: Source, df: pl.DataFrame, column: str, *, time_unit: str | None,
                     timestamp_format: str | None) -> tuple[pl.Series, str]:
    """(seconds since the earliest arrival, a text naming that origin) for `df[column]`."""
    values = df[column]
    if values.dtype == pl.Datetime or timestamp_format is not None:
        ns, origin = _epoch_ns(src, df, column, timestamp_format or "auto")
        return _divide(ns - ns.min(), 1e9), origin
    if time_unit is None:
        raise src.error(None, column, "say how time is written: --time-unit s|ms|us for numbers "
                        "or --timestamp-format FMT (or auto) for text")
    if time_unit not in TIME_UNITS_S:
        raise src.error(None, column, f"unknown time unit {time_unit!r}; use one of {sorted(TIME_UNITS_S)}")
    _check_finite(src, df, column)
    first = values.min()
    return _divide(values - first, TIME_UNITS_S[time_unit]), f"{first} {time_unit}"


def _divide(values: pl.Series, per_s: float) -> pl.Series:
    # numpy's true division is correctly rounded (100 ns -> 1e-07 exactly as written); polars
    # multiplies by the reciprocal, which is off by one ulp for many values.
    return pl.Series("arrival_s", values.cast(pl.Float64).to_numpy() / per_s, dtype=pl.Float64)


def _check_finite(src: Source, df: pl.DataFrame, column: str) -> None:
    col = df[column]
    for mask, what in ((col.is_null(), "missing timestamp"), (col.is_nan(), "timestamp is NaN"),
                       (col.is_infinite(), "timestamp is infinite")):
        if mask.any():
            raise src.error(int(df["_row"][int(mask.arg_max())]), column, what)


def _epoch_ns(src: Source, df: pl.DataFrame, column: str, fmt: str) -> tuple[pl.Series, str]:
    raw = df[column]
    if raw.dtype == pl.Datetime:
        parsed = raw
    else:
        if raw.dtype != pl.Utf8:
            raise src.error(None, column, f"a timestamp format was given but the column is {raw.dtype}; "
                            "use --time-unit for numeric times")
        text = raw.str.strip_chars()
        fmt = _pick_format(text) if fmt == "auto" else fmt
        try:
            parsed = text.str.to_datetime(fmt, time_unit="ns", strict=False)
        except pl.exceptions.PolarsError as exc:
            raise src.error(None, column, f"bad timestamp format {fmt!r} ({exc})") from None
        bad = parsed.is_null()
        if bad.any():
            i = int(bad.arg_max())
            shown = "empty" if raw[i] is None or not raw[i].strip() else repr(raw[i])
            raise src.error(int(df["_row"][i]), column,
                            f"unparsable timestamp {shown} (format {fmt!r}; set --timestamp-format)")
        _check_ns_range(src, df, column, text, fmt)
    if parsed.dtype.time_zone is not None:  # type: ignore[union-attr]
        parsed = parsed.dt.convert_time_zone("UTC")
    bad = parsed.is_null()
    if bad.any():
        raise src.error(int(df["_row"][int(bad.arg_max())]), column, "missing timestamp")
    origin = str(raw[int(parsed.arg_min())])
    return parsed.dt.epoch("ns"), origin


# Nanosecond datetimes span 1677-09-21 .. 2262-04-11; polars wraps a year outside silently (9999 became
# 1816, reported as "timestamp decreases"), so the year is checked first.
_NS_YEARS = (1678, 2261)


def _check_ns_range(src: Source, df: pl.DataFrame, column: str, text: pl.Series, fmt: str) -> None:
    if fmt.startswith("%Y"):  # every auto format: the year is the leading digits, no second parse
        year = text.str.extract(r"^\s*([+-]?\d+)", 1).cast(pl.Int64, strict=False)
    else:
        year = text.str.to_datetime(fmt, time_unit="us", strict=False).dt.year().cast(pl.Int64)
    out = ((year < _NS_YEARS[0]) | (year > _NS_YEARS[1])).fill_null(False)
    if out.any():
        i = int(out.arg_max())
        raise src.error(int(df["_row"][i]), column,
                        f"timestamp {df[column][i]!r} is out of range (year {year[i]}); kvcap reads "
                        f"years {_NS_YEARS[0]} to {_NS_YEARS[1]}")


def _pick_format(text: pl.Series) -> str:
    sample = text.drop_nulls().head(1)
    for fmt in AUTO_TIMESTAMP_FORMATS:
        if len(sample) and sample.str.to_datetime(fmt, time_unit="ns", strict=False).null_count() == 0:
            return fmt
    return AUTO_TIMESTAMP_FORMATS[0]
