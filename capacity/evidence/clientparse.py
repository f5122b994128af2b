"""Client-side results with token timings -> one `client_tokens` frame (one row per token).

Formats:
- vLLM's serving benchmark (`benchmarks/benchmark_serving.py`, `vllm bench serve`) saved with
  `--save-result --save-detailed`: a JSON object with per-request lists `ttfts`, `itls` (seconds),
  `input_lens`, `output_lens`, `errors` and, in newer versions, `start_times`. The start times are
  `time.perf_counter()` values (no wall clock), so the wall-clock anchor is the file's `date` (written
  when the run ended) minus `duration`, unless the caller gives `client_start`. One "token" is one
  streamed chunk, as in vLLM's ITL metric. With `--append-result` the file holds one such object per
  line (one run each): request ids count on across runs, as the trace loader numbers them
  (traces.vllm_bench).
- vLLM's per-request rows (its `RequestFuncOutput` as JSONL: `start_time`, `ttft`, `itl`,
  `prompt_len`, `output_tokens`, `success`, `error`): the same, one object per request; no wall clock.
- Generic CSV / JSONL: `request_id`, `send_time` and either `token_times` (a JSON list, or values
  separated by ';' or spaces; one row per request) or `token_time` (one row per token). Times are
  ISO strings or Unix seconds (absolute), or seconds from an unknown origin (< 1e8: relative; they
  become absolute with `client_start`).
Absolute times are naive UTC datetimes and `*_epoch_s` seconds (the clock logparse uses).
Must not import duckdb, altair or replay.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from traces import vllm_bench
from traces.schema import TraceError

CLIENT_SCHEMA = {
    "source_file": pl.Utf8, "request_id": pl.Utf8, "send_epoch_s": pl.Float64,
    "send_time": pl.Datetime("us"), "token_index": pl.Int32, "rel_s": pl.Float64,
    "token_epoch_s": pl.Float64, "token_time": pl.Datetime("us"), "ttft_s": pl.Float64,
    "itl_s": pl.Float64, "prompt_tokens": pl.Int32, "output_tokens": pl.Int32,
}
RELATIVE_BELOW_S = 1e8      # numbers below this are seconds from an unknown origin, not Unix time
_ALIASES = {
    "request_id": ("request_id", "id", "request", "req_id"),
    "send_time": ("send_time", "send_s", "start_time", "arrival_time", "arrival_s", "arrival",
                  "timestamp"),
    "token_times": ("token_times", "token_timestamps"),
    "token_time": ("token_time", "token_timestamp", "token_s"),
    "prompt_tokens": ("prompt_tokens", "input_len", "input_tokens", "prompt_len"),
    "output_tokens": ("output_tokens", "output_len", "completion_tokens"),
}


class ClientFormatError(ValueError):
    """The file is not a client results file kvcap can read (one-line reason)."""


def looks_like_vllm_bench(obj: object) -> bool:
    return isinstance(obj, dict) and "ttfts" in obj and "itls" in obj


def to_epoch(t: datetime) -> float:
    return t.replace(tzinfo=timezone.utc).timestamp()


def from_epoch(s: float) -> datetime:
    return datetime.fromtimestamp(s, tz=timezone.utc).replace(tzinfo=None)


def parse_client_file(path: str | Path, *, client_start: datetime | None = None) -> pl.DataFrame:
    path = Path(path)
    try:
        runs = vllm_bench.read_runs(path)
    except TraceError as e:
        raise ClientFormatError(str(e)) from None
    if runs is not None:
        # `--append-result`: one run per line, each anchored by its own date; ids count on.
        frames, offset = [], 0
        for k, run in enumerate(runs):
            frames.append(bench_tokens(run, path.name, client_start=client_start if k == 0 else None,
                                       id_offset=offset))
            offset += run.n
        return pl.concat(frames)
    text = path.read_text()
    if text.lstrip()[:1] == "{":
        try:
            json.loads(text)
        except json.JSONDecodeError:
            rows = pl.read_ndjson(path)
        else:
            raise ClientFormatError(f"{path.name}: JSON without 'ttfts'/'itls' (was it saved with "
                                    "--save-detailed?)")
    else:
        rows = pl.read_csv(path, infer_schema_length=0)     # all text: we parse times ourselves
    return generic_tokens(rows, path.name, client_start=client_start,
                          lines=_record_lines(text, rows.height, csv=text.lstrip()[:1] != "{"))


def vllm_bench_tokens(obj: dict, source: str, *, client_start: datetime | None = None,
                      id_offset: int = 0) -> pl.DataFrame:
    """One result object (the dict `vllm bench serve` saves) -> token rows."""
    try:
        run = vllm_bench.run_from_object(obj, source)
    except TraceError as e:
        raise ClientFormatError(str(e)) from None
    return bench_tokens(run, source, client_start=client_start, id_offset=id_offset)


def bench_tokens(run: vllm_bench.BenchRun, source: str, *, client_start: datetime | None = None,
                 id_offset: int = 0) -> pl.DataFrame:
    """A run's successful requests (no error, a first token) -> one row per streamed chunk."""
    if not {"ttfts", "itls"} <= run.saved:
        raise ClientFormatError(f"{source}: a vllm bench result without 'ttfts'/'itls' (was it "
                                "saved with --save-detailed?)")
    ttft = run.ttft_s
    # A failed request keeps vLLM's ttft 0.0; a negative one is a first token before the send.
    early = ~run.failed & (ttft < 0)
    if early.any():
        i = int(np.argmax(early))
        raise ClientFormatError(f"{source}: request {i}: 'ttfts' {float(ttft[i])!r} s: the first "
                                "token before the request was sent; latencies are seconds >= 0")
    ok = ~run.failed & ~np.isnan(ttft) & (ttft > 0)
    idx = np.flatnonzero(ok)
    have_starts = "start_times" in run.saved and not np.isnan(run.start_s).all()
    if have_starts and np.isnan(run.start_s[idx]).any():
        raise ClientFormatError(f"{source}: request {int(idx[np.isnan(run.start_s[idx])][0])}: "
                                "no start time")
    gap_lens = np.diff(run.itl_offsets)
    bad_gap = ~np.isfinite(run.itl_s) | (run.itl_s < 0)
    bad_req = np.zeros(run.n, dtype=bool)
    bad_req[np.repeat(np.arange(run.n), gap_lens)[bad_gap]] = True
    bad = ok & (bad_req | ~np.isfinite(ttft))
    if bad.any():
        i = int(np.argmax(bad))
        lat = [ttft[i], *run.itl_s[run.itl_offsets[i]:run.itl_offsets[i + 1]]]
        raise ClientFormatError(f"{source}: request {i}: latency "
                                f"{next(float(g) for g in lat if not (np.isfinite(g) and g >= 0))!r} "
                                "in 'ttfts'/'itls'; latencies are finite seconds >= 0")
    # Each successful request: its first token (ttft), then its gaps, in file order.
    lens = gap_lens[idx] + 1
    first = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    vals = np.empty(int(lens.sum()))
    vals[first] = ttft[idx]
    is_gap = np.ones(len(vals), dtype=bool)
    is_gap[first] = False
    glen = gap_lens[idx]
    within = np.arange(int(glen.sum())) - np.repeat(np.cumsum(glen) - glen, glen)
    vals[is_gap] = run.itl_s[np.repeat(run.itl_offsets[:-1][idx], glen) + within]
    s0 = float(run.start_s[idx].min()) if have_starts and len(idx) else None
    rel_send = run.start_s[idx] - s0 if s0 is not None else np.full(len(idx), np.nan)

    def per_token(values: np.ndarray) -> np.ndarray:
        return np.repeat(values, lens)
    df = pl.DataFrame({
        "request_id": per_token(idx + id_offset), "rel_send": per_token(rel_send), "val": vals,
        "first": ~is_gap, "prompt_tokens": per_token(run.input_len[idx]),
        "output_tokens": per_token(run.output_len[idx])}, nan_to_null=True)
    # cum_sum over each request (sequential, as a per-request cumsum adds).
    df = df.with_columns(offs=pl.col("val").cum_sum().over("request_id"),
                         token_index=pl.int_range(pl.len()).over("request_id"))
    df = df.select(
        request_id=pl.col("request_id").cast(pl.Utf8), rel_send="rel_send",
        token_index="token_index", rel_s=pl.col("rel_send") + pl.col("offs"),
        ttft_s=pl.when("first").then("val"), itl_s=pl.when(~pl.col("first")).then("val"),
        prompt_tokens="prompt_tokens", output_tokens="output_tokens")
    anchor = client_start
    date, duration = run.raw.get("date"), run.raw.get("duration")
    if anchor is None and date and duration is not None:
        try:
            anchor = from_epoch(to_epoch(datetime.strptime(date, "%Y%m%d-%H%M%S")) - float(duration))
        except (TypeError, ValueError):
            anchor = None
    return _finish(df, source, to_epoch(anchor) if anchor is not None else None)


def _finish(df: pl.DataFrame, source: str, base_epoch: float | None) -> pl.DataFrame:
    """rel_send / rel_s (seconds from the client's first send) + an anchor -> absolute columns."""
    b = pl.lit(base_epoch, dtype=pl.Float64)
    df = df.with_columns(source_file=pl.lit(source), send_epoch_s=pl.col("rel_send") + b,
                         token_epoch_s=pl.col("rel_s") + b)
    df = df.with_columns(
        send_time=(pl.col("send_epoch_s") * 1e6).cast(pl.Int64).cast(pl.Datetime("us")),
        token_time=(pl.col("token_epoch_s") * 1e6).cast(pl.Int64).cast(pl.Datetime("us")))
    return df.select([pl.col(c).cast(t) for c, t in CLIENT_SCHEMA.items()])


def _column(rows: pl.DataFrame, name: str) -> str | None:
    lower = {c.lower(): c for c in rows.columns}
    return next((lower[a] for a in _ALIASES[name] if a in lower), None)


def _times(values: list[str | None], what: str, source: str) -> tuple[np.ndarray, bool]:
    """Text times -> (seconds, absolute?). ISO strings and Unix seconds are absolute."""
    out = np.full(len(values), np.nan)
    absolute = None
    for i, v in enumerate(values):
        if v is None or str(v).strip() == "":
            continue
        v = str(v).strip()
        try:
            x, is_abs = float(v), float(v) >= RELATIVE_BELOW_S
        except ValueError:
            try:
                t = datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                raise ClientFormatError(f"{source}: {what} {v!r} is neither a number nor an ISO time") from None
            if t.tzinfo is not None:
                t = t.astimezone(timezone.utc).replace(tzinfo=None)
            x, is_abs = to_epoch(t), True
        if absolute is not None and absolute != is_abs:
            raise ClientFormatError(f"{source}: {what} mixes absolute and relative times")
        absolute = is_abs
        out[i] = x
    return out, bool(absolute)


def _record_lines(text: str, n: int, *, csv: bool) -> list[int] | None:
    """The 1-based line each of the `n` records of a CSV (after its header) or JSONL file starts
    on; None when they cannot be told apart (the rows are then numbered, not lined)."""
    import csv as csvmod
    import io
    if not csv:
        lines = [i for i, l in enumerate(text.splitlines(), 1) if l.strip()]
        return lines if len(lines) == n else None
    reader, starts, at = csvmod.reader(io.StringIO(text)), [], 1
    try:
        for k, rec in enumerate(reader):
            if k and rec:
                starts.append(at)
            at = reader.line_num + 1
    except csvmod.Error:
        return None
    return starts if len(starts) == n else None


def generic_tokens(rows: pl.DataFrame, source: str, *, client_start: datetime | None = None,
                   lines: list[int] | None = None) -> pl.DataFrame:
    """Per-request or per-token rows -> token rows. `lines`: each row's line in its file (for
    the errors; else rows are named by number)."""
    rid, send = _column(rows, "request_id"), _column(rows, "send_time")
    wide, long = _column(rows, "token_times"), _column(rows, "token_time")
    if rid is None or send is None or (wide is None and long is None):
        raise ClientFormatError(f"{source}: need columns request_id, send_time and token_times (or "
                                f"token_time); found {', '.join(rows.columns) or 'none'}")
    rows = rows.with_columns(pl.col(c).cast(pl.Utf8) for c in rows.columns
                             if not isinstance(rows.schema[c], pl.List))
    lined = lines is not None and len(lines) == rows.height

    def where(row: int) -> str:
        return f"line {lines[row]}" if lined else f"row {row + 1}"
    rows = rows.with_columns(_row=pl.int_range(pl.len()))
    if wide is not None:
        tt = rows[wide]
        lists = (tt.to_list() if isinstance(tt.dtype, pl.List)
                 else [_split_list(v) for v in tt.to_list()])
        rows = rows.with_columns(pl.Series("_tok", [[None if x is None else str(x) for x in l]
                                                    for l in lists], dtype=pl.List(pl.Utf8)))
        rows = rows.explode("_tok")
        long = "_tok"
    send_s, send_abs = _times(rows[send].to_list(), "send_time", source)
    tok_s, tok_abs = _times(rows[long].to_list(), "token time", source)
    if send_abs != tok_abs:
        raise ClientFormatError(f"{source}: send_time and token times must use the same clock")
    extra = {k: (rows[c].cast(pl.Int32, strict=False) if (c := _column(rows, k)) else None)
             for k in ("prompt_tokens", "output_tokens")}
    df = pl.DataFrame({"request_id": rows[rid].cast(pl.Utf8), "send_s": send_s, "tok_s": tok_s,
                       "prompt_tokens": extra["prompt_tokens"], "output_tokens": extra["output_tokens"],
                       "_row": rows["_row"], "_send": rows[send]})
    df = df.filter(pl.col("tok_s").is_not_nan()).sort(["request_id", "tok_s"])
    if df.height == 0:
        raise ClientFormatError(f"{source}: no token timestamps")
    # A token before its send (TTFT < 0) or a token without a send time is a broken row, never
    # stored (it would be a negative latency in every analysis).
    bad = df.filter(pl.col("send_s").is_nan() | (pl.col("tok_s") < pl.col("send_s")))
    if bad.height:
        r = bad.sort("_row").row(0, named=True)
        if np.isnan(r["send_s"]):
            raise ClientFormatError(f"{source}: {where(r['_row'])}: request {r['request_id']!r} has "
                                    f"token times but no {send}")
        raise ClientFormatError(f"{source}: {where(r['_row'])}: request {r['request_id']!r}: a token "
                                f"{r['send_s'] - r['tok_s']:.6g} s before its {send} {r['_send']!r} "
                                "(a negative TTFT); token times come after the send")
    origin = float(df["send_s"].min())
    df = df.with_columns(
        token_index=pl.int_range(pl.len()).over("request_id"),
        rel_send=pl.col("send_s") - origin, rel_s=pl.col("tok_s") - origin)
    df = df.with_columns(
        ttft_s=pl.when(pl.col("token_index") == 0).then(pl.col("tok_s") - pl.col("send_s")),
        itl_s=pl.col("tok_s").diff().over("request_id"))
    if send_abs:
        base = origin
    else:
        base = to_epoch(client_start) if client_start is not None else None
    return _finish(df, source, base)


def _split_list(v) -> list:
    if v is None:
        return []
    s = str(v).strip()
    if s.startswith("["):
        return json.loads(s)
    return [x for x in re.split(r"[;\s]+", s) if x]
