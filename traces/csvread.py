"""CSV reading that never lets a parser exception escape: three tiers, fastest first.

1. Typed scan: polars reads the needed columns straight into their dtypes. Quoting is off
   (`quote_char=None`), so one record is one physical line and row N is line N + 2; the line ending
   is the header's (`\\n`, `\\r\\n` or CR-only `\\r`).
2. Text scan (tier 1 failed: e.g. a padded `, 500 ,`): the same scan as text, values stripped of
   blanks and cast; the first value that is not a number is an error at its line.
3. Python's csv module (tier 2 failed, a needed value holds a quote, or a row has no value in the
   header's last column): quoted fields (newlines inside quotes included), ragged rows and mixed
   line endings. A record whose field count differs from the header's is an error at its line
   naming the first field it lacks (never read shifted), a misshapen one over several lines is a
   stray quote; extra fields that are empty (a trailing comma) are accepted. Only this tier loops
   over rows in Python, and only damaged, quoted or sparse files reach it.
Blank lines at the end of a file are not requests. Must not import replay/ or capacity/.
"""
from __future__ import annotations

import csv
import io

import numpy as np
import polars as pl

from traces.schema import TraceError

# Errors polars raises while scanning a damaged file (the Rust panic type derives from BaseException).
POLARS_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException, OverflowError, ValueError)


def read_csv_columns(src, dtypes: dict[str, pl.DataType]):
    """(src, frame of the named columns plus `_row`); src gains a row -> line map in tier 3."""
    names = list(dtypes)
    eol = "\r" if src.eol == "\r" else "\n"
    scan = dict(infer_schema=False, quote_char=None, eol_char=eol, encoding="utf8-lossy",
                with_column_names=lambda cols: [c.strip() for c in cols])
    text_cols = [n for n, t in dtypes.items() if t == pl.Utf8]
    # The header's last named column is read too: a row with fewer fields than the header has no
    # value there (polars fills it with null and shifts nothing back), so such a file goes to
    # tier 3, which names the line and the missing field.
    last = next((c for c in reversed(src.columns) if c), None)
    extra = [last] if last is not None and last not in names else []
    try:
        df = pl.scan_csv(src.path, schema_overrides=dtypes, **scan).select(names + extra) \
            .with_row_index("_row").collect()
        if not _has_quotes(df, text_cols) and not _short_rows(df, names, last):
            return src, _drop_trailing_blank(df, names).select("_row", *names)
    except POLARS_ERRORS:
        pass
    try:
        text = pl.scan_csv(src.path, **scan).select(names + extra).with_row_index("_row").collect()
    except POLARS_ERRORS:
        text = None
    if text is not None and not _has_quotes(text, names) and not _short_rows(text, names, last):
        return src, cast_text(src, _drop_trailing_blank(text, names).select("_row", *names), dtypes)
    src, text = _python_csv(src, names)
    return src, cast_text(src, text, dtypes)


def _short_rows(df: pl.DataFrame, names: list[str], last: str | None) -> bool:
    """Whether a row (other than the blank lines at the end) has no value in the header's last
    column: it may be one with fewer fields than the header, or just an empty last value;
    tier 3 tells them apart."""
    if last is None:
        return False
    kept = _drop_trailing_blank(df, names)
    return bool(kept[last].is_null().any())


def _has_quotes(df: pl.DataFrame, columns: list[str]) -> bool:
    """A quote (or a CR inside a `\\n` file) in a value: quoting decides what it means -> tier 3."""
    return any(bool(df[c].str.contains('["\r]').any()) for c in columns)


def _drop_trailing_blank(df: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    blank = pl.all_horizontal([pl.col(n).is_null() for n in names])
    flags = df.select(blank).to_series().to_numpy()
    keep = len(flags)
    while keep > 0 and flags[keep - 1]:
        keep -= 1
    return df.head(keep) if keep < len(df) else df


def cast_text(src, text: pl.DataFrame, dtypes: dict[str, pl.DataType]) -> pl.DataFrame:
    """Text columns -> their dtypes, blanks around a value ignored; the first bad value is an error."""
    out = [pl.col("_row")]
    for name, dtype in dtypes.items():
        raw = pl.col(name).str.strip_chars()
        raw = pl.when(raw == "").then(None).otherwise(raw)
        out.append(raw.alias(name) if dtype == pl.Utf8 else raw.cast(dtype, strict=False).alias(name))
    stripped = text.select(out)
    for name, dtype in dtypes.items():
        if dtype == pl.Utf8:
            continue
        raw = text[name].str.strip_chars()
        lost = raw.is_not_null() & (raw != "") & stripped[name].is_null()
        if lost.any():
            i = int(lost.arg_max())
            raise src.error(int(text["_row"][i]), name, f"non-numeric value {text[name][i]!r}")
    return stripped


def _python_csv(src, names: list[str]):
    """Tier 3: every record checked for shape; the frame of text values and the row -> line map."""
    want = [src.columns.index(n) for n in names]
    width = len(src.columns)
    cols: list[list[str | None]] = [[] for _ in names]
    lines: list[int] = []
    with src.path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
        reader = csv.reader(fh, strict=True)
        start = 1
        try:
            next(reader, None)  # the header (already read by open_source)
            start = reader.line_num + 1
            for record in reader:
                end = reader.line_num
                if record and any(f.strip() for f in record):
                    shaped = len(record) == width or (len(record) > width and not any(
                        f.strip() for f in record[width:]))
                    if end > start and not shaped:
                        # A quoted value may hold newlines (RFC 4180); one that swallows the
                        # lines after it and leaves the record misshapen is a stray quote.
                        raise src.at_line(start, "a quoted field runs over several lines "
                                          f"(to line {end}); a stray quote?")
                    if len(record) < width:
                        header = ", ".join(src.columns)
                        header = header if len(header) <= 160 else header[:157] + "..."
                        raise src.at_line(start, f"{len(record)} fields, the header has {width} "
                                          f"({header}): a value is missing, so none is read "
                                          "shifted; write every field (an empty one as ,,)")
                    if not shaped:
                        raise src.at_line(start, f"{len(record)} fields, the header has {width}")
                    for out, j in zip(cols, want):
                        out.append(record[j] if j < len(record) else None)
                    lines.append(start)
                start = end + 1
        except csv.Error as exc:
            stray = "; a stray quote?" if "end of data" in str(exc) else ""
            raise src.at_line(start, f"malformed CSV ({exc}){stray}") from None
    if not lines:
        return src, pl.DataFrame({"_row": pl.Series([], dtype=pl.UInt32),
                                  **{n: pl.Series([], dtype=pl.Utf8) for n in names}})
    frame = pl.DataFrame({"_row": pl.int_range(len(lines), eager=True, dtype=pl.UInt32),
                          **{n: pl.Series(n, c, dtype=pl.Utf8) for n, c in zip(names, cols)}})
    return src.with_lines(np.asarray(lines, dtype=np.int64)), frame


def header(path) -> tuple[tuple[str, ...], str]:
    """(column names, stripped of blanks and a UTF-8 BOM; the header's line ending)."""
    with path.open("rb") as fh:
        head = fh.read(1 << 16)
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    try:
        names = next(csv.reader(io.StringIO(text, newline="")), [])
    except csv.Error:
        names = []
    cut = min((i for i in (text.find("\r"), text.find("\n")) if i >= 0), default=-1)
    eol = "\n"
    if cut >= 0 and text[cut] == "\r" and text[cut + 1:cut + 2] != "\n":
        eol = "\r"
    cleaned = tuple(h.strip() for h in names)
    if not any(cleaned):
        raise TraceError(f"{path}, line 1: file is empty (no header and no requests)")
    seen = set()
    for name in cleaned:
        if name and name in seen:
            raise TraceError(f"{path}, line 1, column '{name}': the header names this column twice")
        seen.add(name)
    return cleaned, eol
