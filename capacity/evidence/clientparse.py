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
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

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


def looks_like_bench_request(obj: object) -> bool:
    return isinstance(obj, dict) and "ttft" in obj and "itl" in obj


def _bench_rows_as_result(rows: list[dict]) -> dict:
    """Per-request rows -> the result object's per-request lists (a failed row keeps its error)."""
    def err(r: dict) -> str:
        return "" if r.get("success", True) and not r.get("error") else (r.get("error") or "failed")
    return {"ttfts": [r.get("ttft") for r in rows], "itls": [r.get("itl") or [] for r in rows],
            "start_times": [r.get("start_time") for r in rows], "input_lens": [r.get("prompt_len") for r in rows],
            "output_lens": [r.get("output_tokens") for r in rows], "errors": [err(r) for r in rows]}


def to_epoch(t: datetime) -> float:
    return t.replace(tzinfo=timezone.utc).timestamp()


def from_epoch(s: float) -> datetime:
    return datetime.fromtimestamp(s, tz=timezone.utc).replace(tzinfo=None)


def parse_client_file(path: str | Path, *, client_start: datetime | None = None) -> pl.DataFrame:
    path = Path(path)
    text = path.read_text()
    head = text.lstrip()[:1]
    if head == "{":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if obj is not None:
            if not looks_like_vllm_bench(obj):
                raise ClientFormatError(f"{path.name}: JSON without 'ttfts'/'itls' (was it saved with "
                                        "--save-detailed?)")
            return vllm_bench_tokens(obj, path.name, client_start=client_start)
        objs = _json_lines(text, path.name)
        if objs and looks_like_vllm_bench(objs[0]):
            return _bench_runs(objs, path.name, client_start)
        if objs and looks_like_bench_request(objs[0]):
            return vllm_bench_tokens(_bench_rows_as_result(objs), path.name, client_start=client_start)
        rows = pl.read_ndjson(path)
    else:
        rows = pl.read_csv(path, infer_schema_length=0)     # all text: we parse times ourselves
    return generic_tokens(rows, path.name, client_start=client_start)


def _json_lines(text: str, source: str) -> list:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ClientFormatError(f"{source}, line {lineno}: invalid JSON ({e.msg})") from None
    return out


def _bench_runs(objs: list, source: str, client_start: datetime | None) -> pl.DataFrame:
    """`--append-result`: one run per line, each anchored by its own date; ids count on."""
    frames, offset = [], 0
    for run, obj in enumerate(objs, 1):
        if not looks_like_vllm_bench(obj):
            raise ClientFormatError(f"{source}, line {run}: not a vllm bench result with 'ttfts'/'itls'")
        frames.append(vllm_bench_tokens(obj, source, client_start=client_start if run == 1 else None,
                                        id_offset=offset))
        offset += len(obj["ttfts"])
    return pl.concat(frames)


def vllm_bench_tokens(obj: dict, source: str, *, client_start: datetime | None = None,
                      id_offset: int = 0) -> pl.DataFrame:
    ttfts, itls = obj["ttfts"], obj["itls"]
    n = len(ttfts)
    if len(itls) != n:
        raise ClientFormatError(f"{source}: 'ttfts' has {n} entries but 'itls' {len(itls)}")
    errors = obj.get("errors") or [""] * n
    starts = obj.get("start_times")
    if starts is not None and all(v is None for v in starts):
        starts = None
    ins, outs = obj.get("input_lens") or [None] * n, obj.get("output_lens") or [None] * n
    ok = [(not errors[i]) and ttfts[i] is not None and ttfts[i] > 0 for i in range(n)]
    anchor = client_start
    if anchor is None and obj.get("date") and obj.get("duration") is not None:
        try:
            end = datetime.strptime(obj["date"], "%Y%m%d-%H%M%S")
            anchor = from_epoch(to_epoch(end) - float(obj["duration"]))
        except ValueError:
            anchor = None
    s0 = min(starts[i] for i in range(n) if ok[i]) if starts and any(ok) else None
    cols: dict[str, list] = {k: [] for k in ("request_id", "rel_send", "token_index", "rel_s", "ttft_s",
                                              "itl_s", "prompt_tokens", "output_tokens")}
    for i in range(n):
        if not ok[i]:
            continue
        if starts and starts[i] is None:
            raise ClientFormatError(f"{source}: request {i}: no start time")
        try:
            gaps = [float(x) for x in itls[i]]
        except (TypeError, ValueError):
            raise ClientFormatError(f"{source}: request {i}: 'itls' is not a list of numbers") from None
        bad = next((g for g in (float(ttfts[i]), *gaps) if not math.isfinite(g) or g < 0), None)
        if bad is not None:
            raise ClientFormatError(f"{source}: request {i}: latency {bad!r} in 'ttfts'/'itls'; "
                                    "latencies are finite seconds >= 0")
        rel_send = (float(starts[i]) - s0) if s0 is not None else None
        offs = np.cumsum([float(ttfts[i]), *gaps])
        k = len(offs)
        cols["request_id"] += [str(id_offset + i)] * k
        cols["rel_send"] += [rel_send] * k
        cols["token_index"] += list(range(k))
        cols["rel_s"] += [None] * k if rel_send is None else list(rel_send + offs)
        cols["ttft_s"] += [float(ttfts[i])] + [None] * (k - 1)
        cols["itl_s"] += [None] + gaps
        cols["prompt_tokens"] += [ins[i]] * k
        cols["output_tokens"] += [outs[i]] * k
    df = pl.DataFrame(cols, schema_overrides={"rel_send": pl.Float64, "rel_s": pl.Float64,
                                              "ttft_s": pl.Float64, "itl_s": pl.Float64})
    base = to_epoch(anchor) if anchor is not None else None
    return _finish(df, source, base)


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


def generic_tokens(rows: pl.DataFrame, source: str, *, client_start: datetime | None = None) -> pl.DataFrame:
    rid, send = _column(rows, "request_id"), _column(rows, "send_time")
    wide, long = _column(rows, "token_times"), _column(rows, "token_time")
    if rid is None or send is None or (wide is None and long is None):
        raise ClientFormatError(f"{source}: need columns request_id, send_time and token_times (or "
                                f"token_time); found {', '.join(rows.columns) or 'none'}")
    rows = rows.with_columns(pl.col(c).cast(pl.Utf8) for c in rows.columns
                             if not isinstance(rows.schema[c], pl.List))
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
                       "prompt_tokens": extra["prompt_tokens"], "output_tokens": extra["output_tokens"]})
    df = df.filter(pl.col("tok_s").is_not_nan()).sort(["request_id", "tok_s"])
    if df.height == 0:
        raise ClientFormatError(f"{source}: no token timestamps")
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
