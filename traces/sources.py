"""Raw file access for the loaders: file kind, header, typed column reads, and where a row lives.

Owns everything that touches bytes: sniffing CSV / JSONL / Parquet, reading the header or the first
JSON object, scanning only the needed columns with explicit dtypes (lazy scans, so a 10M-row file
costs only its selected columns), and turning a polars parse failure into a `TraceError` that names
the file, line and column. Row -> line mapping: CSV line = data row + 2 (the header is line 1; one
record per line); JSONL line = the row's non-blank line. Must not import replay/ or capacity/.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from traces.schema import TraceError

Kind = Literal["csv", "jsonl", "parquet"]

_EXT_KIND: dict[str, Kind] = {".csv": "csv", ".txt": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
                              ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def file_kind(path: Path) -> Kind:
    """Kind from the extension, else from the first bytes (Parquet magic, a JSON object, or CSV)."""
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    kind = _EXT_KIND.get(path.suffix.lower())
    if kind is not None:
        return kind
    with path.open("rb") as fh:
        head = fh.read(4)
    if head == b"PAR1":
        return "parquet"
    return "jsonl" if head.lstrip()[:1] == b"{" else "csv"


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """One input file: its kind and its column (or key) names in file order."""
    path: Path
    kind: Kind
    columns: tuple[str, ...]

    def where(self, row: int) -> str:
        """'line N' (CSV, JSONL) or 'row N' (Parquet, 1-based) for a 0-based data row."""
        if self.kind == "csv":
            return f"line {row + 2}"
        if self.kind == "jsonl":
            return f"line {_jsonl_line(self.path, row)}"
        return f"row {row + 1}"

    def error(self, row: int | None, column: str | None, what: str) -> TraceError:
        """The one-line error every loader raises: file, line/row, column, what is wrong."""
        parts = [str(self.path)]
        if row is not None:
            parts.append(self.where(row))
        if column is not None:
            parts.append(f"column '{column}'")
        return TraceError(", ".join(parts) + f": {what}")


def open_source(path: Path) -> Source:
    kind = file_kind(path)
    if path.stat().st_size == 0:
        raise TraceError(f"{path}, line 1: file is empty (no header and no requests)")
    if kind == "csv":
        columns = _csv_header(path)
    elif kind == "jsonl":
        columns = _jsonl_keys(path)
    else:
        try:
            columns = tuple(pl.read_parquet_schema(path))
        except Exception as exc:  # polars raises several types for a non-Parquet file
            raise TraceError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    return Source(path=path, kind=kind, columns=columns)


def _csv_header(path: Path) -> tuple[str, ...]:
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        header = next(csv.reader(fh), [])
    names = tuple(h.strip() for h in header)
    if not any(names):
        raise TraceError(f"{path}, line 1: file is empty (no header and no requests)")
    return names


def _jsonl_keys(path: Path) -> tuple[str, ...]:
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                return tuple(_parse_json_object(path, lineno, line))
    raise TraceError(f"{path}, line 1: file is empty (no requests)")


def _parse_json_object(path: Path, lineno: int, line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}, line {lineno}, column {exc.colno}: invalid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{path}, line {lineno}: expected one JSON object per line, got {type(obj).__name__}")
    return obj


def _jsonl_line(path: Path, row: int) -> int:
    """1-based line of the row-th non-blank line (polars skips blank lines). Error path only."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        seen = -1
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                seen += 1
                if seen == row:
                    return lineno
    return row + 1


def read_columns(src: Source, dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame:
    """The named source columns plus `_row` (0-based data row), in file order.

    Numbers are read straight into their dtype (fast path); when polars cannot parse a value the file
    is re-read as text to find the first bad row and name it. A dtype of None keeps the file's own
    type (Parquet only; e.g. a native Datetime column).
    """
    names = list(dtypes)
    if src.kind == "parquet":
        return _read_parquet(src, dtypes)
    typed = {n: (t if t is not None else pl.Utf8) for n, t in dtypes.items()}
    try:
        if src.kind == "csv":
            # infer_schema=False: other columns stay text, so a column we never use cannot fail.
            lf = pl.scan_csv(src.path, infer_schema=False, schema_overrides=typed, encoding="utf8-lossy")
        else:
            lf = pl.scan_ndjson(src.path, schema=typed)
        return lf.select(names).with_row_index("_row").collect()
    except pl.exceptions.PolarsError as exc:
        raise _diagnose(src, typed, exc) from None


def _read_parquet(src: Source, dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame:
    raw = pl.scan_parquet(src.path).select(list(dtypes)).with_row_index("_row").collect()
    out = raw.with_columns([pl.col(n).cast(t, strict=False) for n, t in dtypes.items() if t is not None])
    for name, dtype in dtypes.items():
        if dtype is None:
            continue
        lost = raw[name].is_not_null() & out[name].is_null()
        if lost.any():
            row = int(lost.arg_max())
            raise src.error(row, name, f"value {raw[name][row]!r} is not a valid {dtype}")
    return out


def _diagnose(src: Source, dtypes: dict[str, pl.DataType], exc: Exception) -> TraceError:
    if src.kind == "jsonl":
        return _diagnose_jsonl(src, dtypes, exc)
    text = pl.scan_csv(src.path, infer_schema=False, encoding="utf8-lossy").select(list(dtypes)) \
        .with_row_index("_row").collect()
    for name, dtype in dtypes.items():
        if dtype == pl.Utf8:
            continue
        raw = text[name].str.strip_chars()
        bad = text.filter(raw.is_not_null() & (raw != "") & raw.cast(dtype, strict=False).is_null())
        if len(bad):
            return src.error(int(bad["_row"][0]), name, f"non-numeric value {bad[name][0]!r}")
    return TraceError(f"{src.path}: cannot read the file ({_first_line(exc)})")


def _diagnose_jsonl(src: Source, dtypes: dict[str, pl.DataType], exc: Exception) -> TraceError:
    """Walk the lines (error path only) to find the first bad JSON or wrongly typed value."""
    with src.path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            obj = _parse_json_object(src.path, lineno, line)
            for name, dtype in dtypes.items():
                value = obj.get(name)
                if value is None:
                    continue
                if not _json_value_fits(value, dtype):
                    return TraceError(f"{src.path}, line {lineno}, column '{name}': "
                                      f"value {json.dumps(value)[:60]} is not a valid {dtype}")
    return TraceError(f"{src.path}: cannot read the file ({_first_line(exc)})")


def _json_value_fits(value: object, dtype: pl.DataType) -> bool:
    if isinstance(dtype, pl.List):
        return isinstance(value, list) and all(_json_value_fits(v, dtype.inner) for v in value)
    if dtype == pl.Utf8:
        return isinstance(value, str)
    if dtype.is_integer():
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
