"""`load_trace`: any supported file -> the canonical trace, plus a `LoadReport` of what happened.

Owns the pipeline: open the file, pick the format (given, mapped, or detected), read only the needed
columns with explicit dtypes, turn times into seconds from the first request, check every value
(traces.validate) and assemble the canonical columns; and `write_trace`, which writes kvcap's
Parquet atomically (temp file in the same directory, then rename).

BurstGPT: a row whose `Response tokens` is 0 or whose `Log Type` mentions a failure is a failed
request. Failed requests produced no output, so they do not enter the canonical trace (output_tokens
must be > 0); they are counted in `LoadReport.failed_requests`, which `kvcap trace info` prints.
Their source rows stay identifiable: `request_id` is the 0-based data row of the source file for
every format without its own id. The tenant of a BurstGPT row is its `Model`.

Lengths-only layouts (Vidur's arxiv-summarization / BWB files; length columns without times) get
their arrival times from `arrivals` (traces.arrivals: seeded Poisson or gamma) and are refused
without it, naming `--arrivals`; a file with its own times refuses `arrivals`. `write_trace` keeps
the synthesised arrivals and the source layout in the Parquet's metadata (`kvcap.arrivals`,
`kvcap.source_format`), which loading that Parquet reports again.
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import contextlib
import csv
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traces import formats, validate, vllm_bench
from traces.arrivals import FLAG as ARRIVALS_FLAG
from traces.arrivals import HOW as ARRIVALS_HOW
from traces.arrivals import Arrivals
from traces.atomic import atomic_path
from traces.csvread import POLARS_ERRORS
from traces.schema import (HASH_BLOCK_TOKENS, SCHEMA, TraceError, check_hash_block_tokens,
                           with_hash_block_tokens)
from traces.sources import Source, open_source, read_columns
from traces.timeparse import relative_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    path: str
    format: str
    rows_read: int            # data rows in the file
    requests: int             # rows in the canonical trace
    failed_requests: int = 0  # BurstGPT failures, excluded (see module docstring)
    rows_reordered: int = 0   # rows moved by the stable sort of an unsorted generic file
    time_origin: str = ""     # the first request's timestamp as written in the file
    # Synthetic arrivals given a lengths-only trace ("poisson:5 seed 0"), here or when the kvcap
    # Parquet was written; the layout they were given to (`format`, or the Parquet's source).
    arrivals: str | None = None
    source_format: str | None = None

    def metadata(self) -> dict[str, str]:
        """What kvcap's Parquet keeps of this load (write_trace)."""
        if self.arrivals is None:
            return {}
        return {ARRIVALS_KEY: self.arrivals, SOURCE_KEY: self.source_format or self.format}


ARRIVALS_KEY, SOURCE_KEY = "kvcap.arrivals", "kvcap.source_format"


def load_trace(path: str | Path, format: str | None = None, mapping: Mapping[str, str] | None = None,
               time_unit: str | None = None, timestamp_format: str | None = None,
               hash_block_tokens: int | None = None, arrivals: Arrivals | None = None) -> pl.DataFrame:
    """The canonical trace of `path`. `mapping` is `{source column: canonical field}`;
    `hash_block_tokens`: prompt tokens per prefix hash, overriding the file's (Mooncake: 512);
    `arrivals`: the arrival times of a lengths-only file (required there, refused elsewhere)."""
    return load_trace_with_report(path, format=format, mapping=mapping, time_unit=time_unit,
                                  timestamp_format=timestamp_format,
                                  hash_block_tokens=hash_block_tokens, arrivals=arrivals)[0]


def load_trace_with_report(path: str | Path, format: str | None = None,
                           mapping: Mapping[str, str] | None = None, time_unit: str | None = None,
                           timestamp_format: str | None = None,
                           hash_block_tokens: int | None = None,
                           arrivals: Arrivals | None = None) -> tuple[pl.DataFrame, LoadReport]:
    if hash_block_tokens is not None:
        check_hash_block_tokens(hash_block_tokens)
    try:
        with _panic_reports_hidden():
            df, report = _load(Path(path), format, mapping, time_unit, timestamp_format, arrivals)
    except TraceError:
        raise
    except (*POLARS_ERRORS, OSError, UnicodeError, csv.Error, RecursionError) as exc:
        # Last line of defence: the readers name the line for every damage the fuzz tests make;
        # anything else a parser throws is still one line naming the file, never a traceback.
        what = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TraceError(f"{path}: cannot read the file ({type(exc).__name__}: {what[:200]})") from None
    if hash_block_tokens is not None:
        df = with_hash_block_tokens(df, hash_block_tokens)
    return df, report


@contextlib.contextmanager
def _panic_reports_hidden():
    """Polars reports a Rust panic (a damaged Parquet page) on fd 2 with a stack backtrace before
    raising it; the exception becomes our one-line error, so that report is dropped. Anything
    else written to stderr meanwhile (warnings) is passed on."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (embedded interpreter): nothing to hide
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            if data and b"panicked at" not in data:
                os.write(2, data)


def _load(path: Path, format: str | None, mapping: Mapping[str, str] | None,
          time_unit: str | None, timestamp_format: str | None,
          arrivals: Arrivals | None = None) -> tuple[pl.DataFrame, LoadReport]:
    if format in (None, formats.VLLM_BENCH) and not mapping and path.is_file():
        runs = vllm_bench.read_runs(path, rows=False)
        if runs is not None:
            if arrivals is not None:
                raise _timed(path, formats.VLLM_BENCH)
            df, report = vllm_bench.load_result(path, runs)
            return df, LoadReport(**report)
    if format == formats.VLLM_BENCH:
        raise TraceError(f"{path}: not a vllm bench result (a JSON object with 'input_lens', "
                         "'output_lens', 'start_times')")
    src = open_source(path)
    spec = _spec(src, format, mapping, time_unit, timestamp_format)
    if spec.lengths_only and arrivals is None:
        raise TraceError(f"{src.path}: lengths only ({spec.name} layout: prompt and output "
                         f"tokens, no arrival times); give it arrivals with {ARRIVALS_FLAG} "
                         f"{ARRIVALS_HOW}, e.g. {ARRIVALS_FLAG} poisson:5 (seeded by --seed)")
    if arrivals is not None and not spec.lengths_only:
        raise _timed(src.path, spec.name)
    present = spec.present(src)
    src, df = read_columns(src, _dtypes(src, spec, present))
    rows_read = len(df)
    if rows_read == 0:
        raise TraceError(f"{src.path}, line 2: file is empty (a header but no requests)")
    failed = 0
    if spec.name == "burstgpt":
        df, failed = _drop_burstgpt_failures(src, df, present)
    elif spec.name == "vllm_bench_requests":
        df, failed = _drop_bench_failures(src, df, present)
    for field in ("prompt_tokens", "output_tokens"):
        validate.check_whole_numbers(src, df, present[field], positive=True)
    if "priority" in present:
        validate.check_whole_numbers(src, df, present["priority"], positive=False)
    if "request_id" in present:
        validate.check_unique_ids(src, df, present["request_id"])
    if "prefix_hashes" in present:
        validate.check_hashes(src, df, present["prefix_hashes"])
    if arrivals is not None:          # lengths only: the requests in file order, timed here
        arrival = pl.Series("arrival_s", arrivals.times(len(df)), dtype=pl.Float64)
        origin, order = "0 s (synthetic arrivals)", None
    else:
        time_col = present["arrival_s"]
        if spec.rebase:
            arrival, origin = relative_seconds(src, df, time_col, time_unit=spec.time_unit,
                                               timestamp_format=spec.timestamp_format)
        else:  # kvcap Parquet: already seconds from the first request; keep them bit for bit
            arrival, origin = _exact_seconds(src, df, time_col)
        order = validate.check_order(src, arrival, df, time_col, sorted_input=spec.sorted_input)
    out = validate.assemble(df, arrival, present)
    if HASH_BLOCK_TOKENS in df.columns:   # kvcap Parquet of a trace with its own granularity
        out = out.with_columns(validate.granularity(src, df))
    moved = 0
    if order is not None:
        moved = int((order != pl.int_range(len(order), eager=True, dtype=order.dtype)).sum())
        out = out[order]
    synthetic, source = (str(arrivals), spec.name) if arrivals is not None else _kept(src, spec)
    report = LoadReport(path=str(src.path), format=spec.name, rows_read=rows_read, requests=len(out),
                        failed_requests=failed, rows_reordered=moved, time_origin=origin,
                        arrivals=synthetic, source_format=source)
    return out, report


def _timed(path, layout: str) -> TraceError:
    return TraceError(f"{ARRIVALS_FLAG}: {path} has its own arrival times ({layout} layout); "
                      f"{ARRIVALS_FLAG} is for lengths-only traces (Vidur's arxiv-summarization "
                      "and BWB files); drop it")


def _kept(src: Source, spec: formats.FormatSpec) -> tuple[str | None, str | None]:
    """The synthetic arrivals (and source layout) a kvcap Parquet was written with."""
    if spec.name != "kvcap":
        return None, None
    try:
        meta = pl.read_parquet_metadata(src.path)
    except (*POLARS_ERRORS, OSError):
        return None, None
    return meta.get(ARRIVALS_KEY), meta.get(SOURCE_KEY)


def _spec(src: Source, format: str | None, mapping: Mapping[str, str] | None,
          time_unit: str | None, timestamp_format: str | None) -> formats.FormatSpec:
    if format is not None and format not in formats.FORMAT_NAMES:
        raise TraceError(f"unknown format {format!r}; formats: {', '.join(formats.FORMAT_NAMES)}")
    if mapping:
        if format in formats.KNOWN:
            raise TraceError(f"--format {format} has a fixed layout; drop --map (or use a generic format)")
        return formats.generic(mapping, src=src, time_unit=time_unit, timestamp_format=timestamp_format)
    if format in formats.KNOWN:
        return formats.KNOWN[format]
    spec = formats.detect(src)
    if spec.name == "generic" and (time_unit or timestamp_format):
        return formats.generic({c: f for f, c in spec.fields.items()}, src=src, time_unit=time_unit,
                               timestamp_format=timestamp_format)
    return spec


def _dtypes(src: Source, spec: formats.FormatSpec, present: dict[str, str]) -> dict[str, pl.DataType | None]:
    """Read dtypes per source column. Lengths and priorities as Float64, so that '12.0' is read and
    '12.5', NaN or a missing value is reported rather than failing inside the CSV parser."""
    text_time = spec.timestamp_format is not None
    if src.kind == "parquet" and spec.rebase and not text_time:
        time_dtype = None  # keep native Datetime / numbers
    else:
        time_dtype = pl.Utf8() if text_time else pl.Float64()
    dtypes: dict[str, pl.DataType | None] = (
        {} if spec.lengths_only else {present["arrival_s"]: time_dtype})
    for field in ("prompt_tokens", "output_tokens", "priority"):
        if field in present:
            dtypes[present[field]] = pl.Float64()
    for field in ("request_id", "tenant", "prefix_hashes"):
        if field in present:
            dtypes[present[field]] = SCHEMA[field]
    if spec.name == "burstgpt" and "Log Type" in src.columns:
        dtypes["Log Type"] = pl.Utf8()
    if spec.name == "vllm_bench_requests" and "success" in src.columns:
        dtypes["success"] = pl.Boolean()
    if spec.name == "kvcap" and HASH_BLOCK_TOKENS in src.columns:
        dtypes[HASH_BLOCK_TOKENS] = pl.Int64()
    return dtypes


def _drop_burstgpt_failures(src: Source, df: pl.DataFrame, present: dict[str, str]) -> tuple[pl.DataFrame, int]:
    failed = (pl.col(present["output_tokens"]) == 0).fill_null(False)
    if "Log Type" in df.columns:
        failed = failed | pl.col("Log Type").str.to_lowercase().str.contains("fail").fill_null(False)
    kept = df.filter(~failed)
    if len(kept) == 0:
        raise TraceError(f"{src.path}: all {len(df)} requests failed (Response tokens 0); nothing to replay")
    return kept, len(df) - len(kept)


def _drop_bench_failures(src: Source, df: pl.DataFrame, present: dict[str, str]) -> tuple[pl.DataFrame, int]:
    """A vllm bench request that failed (success false, or no output) produced nothing to replay."""
    failed = (pl.col(present["output_tokens"]) == 0).fill_null(True)
    if "success" in df.columns:
        failed = failed | ~pl.col("success").fill_null(False)
    kept = df.filter(~failed)
    if len(kept) == 0:
        raise TraceError(f"{src.path}: all {len(df)} requests failed; nothing to replay")
    return kept, len(df) - len(kept)


def _exact_seconds(src: Source, df: pl.DataFrame, column: str) -> tuple[pl.Series, str]:
    col = df[column].cast(pl.Float64)
    for mask, what in ((col.is_null(), "missing value"), (col.is_nan(), "value is NaN"),
                       (col.is_infinite(), "value is infinite")):
        if mask.any():
            raise src.error(int(df["_row"][int(mask.arg_max())]), column, what)
    return col.alias("arrival_s"), f"{col[0]} s"


def write_trace(df: pl.DataFrame, path: str | Path, *, metadata: Mapping[str, str] | None = None) -> None:
    """Write the canonical trace as Parquet; a failure leaves no file (temp file + rename).
    `metadata`: key-value pairs kept in the file (`LoadReport.metadata()`: synthetic arrivals)."""
    path = Path(path)
    missing = [c for c in SCHEMA if c not in df.columns]
    if missing:
        raise TraceError(f"cannot write {path}: not a canonical trace (missing {', '.join(missing)})")
    if path.is_dir():
        raise TraceError(f"cannot write {path}: it is a directory; give a file name such as "
                         f"{path / 'trace.parquet'}")
    if not path.parent.is_dir():
        raise TraceError(f"cannot write {path}: folder {path.parent} does not exist")
    # A disk error propagates as OSError naming `path` (the CLI prints it as one line).
    schema = {**SCHEMA, **({HASH_BLOCK_TOKENS: pl.Int32()} if HASH_BLOCK_TOKENS in df.columns else {})}
    try:
        with atomic_path(path) as tmp:
            df.select(list(schema)).cast(schema).write_parquet(
                tmp, metadata=dict(metadata or {}) or None)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:  # full disk, read-only
        what = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TraceError(f"cannot write {path}: {what[:200]}; nothing was written") from None
