"""Raw file access for the loaders: file kind, header, typed column reads, and where a row lives.

Owns everything that touches bytes: sniffing CSV / JSONL / Parquet, reading the header or the first
JSON object, scanning only the needed columns with explicit dtypes (lazy scans, so a 10M-row file
costs only its selected columns), and turning a polars parse failure into a `TraceError` that names
the file, line and column. Row -> line mapping: CSV line = data row + 2 (the header is line 1; one
record per line); JSONL line = the row's non-blank line. Must not import replay/ or capacity/.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl

from traces import csvread
from traces.schema import TraceError

Kind = Literal["csv", "jsonl", "parquet"]

_EXT_KIND: dict[str, Kind] = {".csv": "csv", ".txt": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
                              ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def file_kind(path: Path) -> Kind:
    """Kind from the extension, else from the first bytes (Parquet magic, a JSON object, or CSV)."""
    if path.is_dir():
        raise TraceError(f"{path}: is a directory; pass a trace file")
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
    eol: str = "\n"                      # CSV: the header's line ending ("\r" for CR-only files)
    # Row -> 1-based line, set when a reader had to skip blank lines or parse quotes (error path).
    lines: np.ndarray | None = None

    def with_lines(self, lines: np.ndarray) -> "Source":
        return replace(self, lines=lines)

    def where(self, row: int) -> str:
        """'line N' (CSV, JSONL) or 'row N' (Parquet, 1-based) for a 0-based data row."""
        if self.lines is not None and 0 <= row < len(self.lines):
            return f"line {int(self.lines[row])}"
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

    def at_line(self, line: int, what: str) -> TraceError:
        return TraceError(f"{self.path}, line {line}: {what}")


def open_source(path: Path) -> Source:
    kind = file_kind(path)
    if path.stat().st_size == 0:
        raise TraceError(f"{path}, line 1: file is empty (no header and no requests)")
    eol = "\n"
    if kind == "csv":
        columns, eol = csvread.header(path)
    elif kind == "jsonl":
        columns = _jsonl_keys(path)
    else:
        try:
            columns = tuple(pl.read_parquet_schema(path))
        except Exception as exc:  # polars raises several types for a non-Parquet file
            raise TraceError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    return Source(path=path, kind=kind, columns=columns, eol=eol)


def _jsonl_keys(path: Path) -> tuple[str, ...]:
    with path.open(encoding="utf-8-sig", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                return tuple(_parse_json_object(path, lineno, line))
    raise TraceError(f"{path}, line 1: file is empty (no requests)")


def _parse_json_object(path: Path, lineno: int, line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}, line {lineno}, column {exc.colno}: invalid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit number, a 10000-deep nesting
        raise TraceError(f"{path}, line {lineno}: invalid JSON ({_first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{path}, line {lineno}: expected one JSON object per line, got {type(obj).__name__}")
    return obj


def _jsonl_line(path: Path, row: int) -> int:
    """1-based line of the row-th non-blank line (polars skips blank lines). Error path only."""
    with path.open(encoding="utf-8-sig", errors="replace") as fh:
        seen = -1
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                seen += 1
                if seen == row:
                    return lineno
    return row + 1


def read_columns(src: Source, dtypes: dict[str, pl.DataType | None]) -> tuple[Source, pl.DataFrame]:
    """(src, the named source columns plus `_row` (0-based data row), in file order).

    Numbers are read straight into their dtype (fast path); when polars cannot parse the file it is
    re-read more carefully (traces.csvread for CSV; line by line for JSONL) to either read it or
    name the first bad line. A dtype of None keeps the file's own type (Parquet only; e.g. a native
    Datetime column). The returned src may carry a row -> line map for the error messages.
    """
    if src.kind == "parquet":
        return src, _read_parquet(src, dtypes)
    typed = {n: (t if t is not None else pl.Utf8()) for n, t in dtypes.items()}
    if src.kind == "csv":
        return csvread.read_csv_columns(src, typed)
    try:
        return src, pl.scan_ndjson(src.path, schema=typed).select(list(typed)) \
            .with_row_index("_row").collect()
    except csvread.POLARS_ERRORS:
        return _read_jsonl_slow(src, typed)


def _read_parquet(src: Source, dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame:
    try:
        raw = pl.scan_parquet(src.path).select(list(dtypes)).with_row_index("_row").collect()
    except (*csvread.POLARS_ERRORS, OSError) as exc:
        raise TraceError(f"{src.path}: not a readable Parquet file ({_first_line(exc)})") from None
    casts = []
    for name, dtype in dtypes.items():
        have = raw[name].dtype
        if dtype is None or have == dtype:
            continue
        if not _castable(have, dtype):
            raise src.error(None, name, f"column type {have} cannot hold {dtype} values")
        if have == pl.Utf8:  # numbers written as text: blanks around them ignored, as in a CSV
            casts.append(pl.col(name).str.strip_chars().cast(dtype, strict=False))
        else:
            casts.append(pl.col(name).cast(dtype, strict=False))
    try:
        out = raw.with_columns(casts)
        for name, dtype in dtypes.items():
            if dtype is None or raw[name].dtype == dtype:
                continue
            lost = _changed_by_cast(raw[name], out[name])
            lost = lost & raw[name].is_not_null()
            if lost.any():
                row = int(lost.arg_max())
                raise src.error(row, name, f"value {_short(raw[name][row])} is not a valid {dtype}")
    except TraceError:
        raise
    except csvread.POLARS_ERRORS as exc:
        raise src.error(None, None, f"cannot convert the columns ({_first_line(exc)})") from None
    return out


def _changed_by_cast(raw: pl.Series, out: pl.Series) -> pl.Series:
    """Rows whose value the cast lost or changed (1.5 -> 1, -1 -> null, 'x' -> null): reported,
    never kept. Text parses or does not (null); numbers must survive the round trip."""
    text = raw.dtype == pl.Utf8 or (isinstance(raw.dtype, pl.List) and raw.dtype.inner == pl.Utf8)
    if isinstance(raw.dtype, pl.List) and text:
        count = lambda s: s.list.eval(pl.element().is_not_null().sum()).list.first()  # noqa: E731
        return (out.is_null() | (count(raw) != count(out))).fill_null(True)
    if text:
        return out.is_null() & (raw.str.strip_chars() != "").fill_null(False)
    return (out.is_null() | (out.cast(raw.dtype, strict=False) != raw)).fill_null(True)


def _castable(have: pl.DataType, want: pl.DataType) -> bool:
    if isinstance(want, pl.List):
        return isinstance(have, (pl.List, pl.Array)) and _castable(have.inner, want.inner)  # type: ignore[union-attr]
    if isinstance(have, (pl.List, pl.Array, pl.Struct)):
        return False
    if want == pl.Utf8:
        return True
    return have.is_numeric() or have == pl.Boolean or have == pl.Utf8 or have == pl.Null


def _short(value: object) -> str:
    text = repr(value.to_list() if isinstance(value, pl.Series) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_jsonl_slow(src: Source, dtypes: dict[str, pl.DataType]) -> tuple[Source, pl.DataFrame]:
    """Line by line (polars could not read the file): the first bad JSON or wrongly typed value is
    an error at its line; otherwise the frame, built from the parsed objects. Error path only."""
    cols: dict[str, list] = {n: [] for n in dtypes}
    lines: list[int] = []
    with src.path.open(encoding="utf-8-sig", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            obj = _parse_json_object(src.path, lineno, line)
            for name, dtype in dtypes.items():
                value = obj.get(name)
                if value is not None and not _json_value_fits(value, dtype):
                    raise TraceError(f"{src.path}, line {lineno}, column '{name}': "
                                     f"value {_json_short(value)} is not a valid {dtype}")
                cols[name].append(value)
            lines.append(lineno)
    try:
        frame = pl.DataFrame({n: pl.Series(n, v, dtype=dtypes[n], strict=False) for n, v in cols.items()})
    except (*csvread.POLARS_ERRORS, TypeError) as exc:
        raise TraceError(f"{src.path}: cannot read the file ({_first_line(exc)})") from None
    frame = frame.with_row_index("_row")
    return src.with_lines(np.asarray(lines, dtype=np.int64)), frame


def _json_short(value: object) -> str:
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _json_value_fits(value: object, dtype: pl.DataType) -> bool:
    if isinstance(dtype, pl.List):
        return isinstance(value, list) and all(v is not None and _json_value_fits(v, dtype.inner)
                                               for v in value)
    if dtype == pl.Utf8:
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    if dtype.is_integer():
        info = np.iinfo(_NUMPY_INT[str(dtype)])
        return isinstance(value, int) and info.min <= value <= info.max
    return isinstance(value, (int, float))


_NUMPY_INT = {"Int32": np.int32, "Int64": np.int64, "UInt64": np.uint64, "UInt32": np.uint32}


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
