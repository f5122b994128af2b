"""`vllm bench serve --save-result --save-detailed` output as a trace (a replayable workload).

vLLM's serving benchmark (`vllm/benchmarks/serve.py`; `benchmarks/benchmark_serving.py` before)
writes one JSON object per run with per-request lists `start_times` (its client's
`time.perf_counter()` at each send), `input_lens`, `output_lens`, `ttfts`, `itls` and `errors`; with
`--append-result` a file holds one such object per line (one run each). The trace is: arrival =
start time minus the earliest one, prompt = input_len, output = output_len. A request that failed
(`errors[i]` non-empty, or no output) produced no output, so it does not enter the trace; it is
counted in `LoadReport.failed_requests`, as BurstGPT failures are. `request_id` is the 0-based index
in the file (runs in order), the same index `kvcap logs` gives that request's client timings.
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from traces.schema import SCHEMA, TraceError

DETAIL_KEYS = ("input_lens", "output_lens")


def result_objects(path: Path) -> list[dict] | None:
    """The benchmark result objects of `path`, or None when it is no vllm bench result file."""
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return None
    if not head.lstrip()[:1] == b"{" or b'"input_lens"' not in head and b'"ttfts"' not in head:
        return None
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    try:
        return [_check_object(path, 1, json.loads(text))]
    except json.JSONDecodeError:
        pass
    objs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                objs.append(_check_object(path, lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}, line {lineno}, column {exc.colno}: invalid JSON ({exc.msg})") from None
    return objs


def _check_object(path: Path, lineno: int, obj) -> dict:
    if not isinstance(obj, dict):
        raise TraceError(f"{path}, line {lineno}: expected a vllm bench result object, got {type(obj).__name__}")
    return obj


def load_result(path: Path, objs: list[dict]) -> tuple[pl.DataFrame, dict]:
    """(canonical trace, the fields of its traces.loaders.LoadReport) of a vllm bench result file."""
    starts, ins, outs, failed_mask = [], [], [], []
    for run, obj in enumerate(objs, 1):
        where = f"{path}, run {run}" if len(objs) > 1 else str(path)
        missing = [k for k in DETAIL_KEYS if k not in obj]
        if missing:
            raise TraceError(f"{where}: no '{missing[0]}': save the benchmark with --save-result "
                             "--save-detailed to replay it")
        if "start_times" not in obj:
            raise TraceError(f"{where}: no 'start_times' (vLLM releases before they were saved): the "
                             "arrival times are unknown; replay it with a synthetic arrival process instead")
        n = len(obj["input_lens"])
        for key in ("output_lens", "start_times", "errors"):
            if key in obj and len(obj[key]) != n:
                raise TraceError(f"{where}, key '{key}': {len(obj[key])} entries, 'input_lens' has {n}")
        errors = obj.get("errors") or [""] * n
        for i in range(n):
            s, p, o = obj["start_times"][i], obj["input_lens"][i], obj["output_lens"][i]
            for key, v in (("start_times", s), ("input_lens", p), ("output_lens", o)):
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                    raise TraceError(f"{where}, key '{key}', request {i}: {v!r} is not a finite number >= 0")
            if p != int(p) or o != int(o) or p < 1:
                raise TraceError(f"{where}, request {i}: lengths must be whole numbers, prompt >= 1 "
                                 f"(input_len {p!r}, output_len {o!r})")
            starts.append(float(s))
            ins.append(int(p))
            outs.append(int(o))
            failed_mask.append(bool(errors[i]) or int(o) == 0)
    rows = len(starts)
    if rows == 0:
        raise TraceError(f"{path}: the benchmark result holds no requests")
    keep = ~np.asarray(failed_mask)
    if not keep.any():
        raise TraceError(f"{path}: all {rows} requests failed; nothing to replay")
    start = np.asarray(starts)
    ids = np.arange(rows)[keep]
    arrival = start[keep] - start[keep].min()
    order = np.argsort(arrival, kind="stable")
    df = pl.DataFrame({
        "request_id": pl.Series(ids[order], dtype=SCHEMA["request_id"]),
        "arrival_s": pl.Series(arrival[order], dtype=pl.Float64),
        "prompt_tokens": pl.Series(np.asarray(ins)[keep][order], dtype=SCHEMA["prompt_tokens"]),
        "output_tokens": pl.Series(np.asarray(outs)[keep][order], dtype=SCHEMA["output_tokens"]),
        "priority": pl.Series([0] * int(keep.sum()), dtype=SCHEMA["priority"]),
        "tenant": pl.Series([None] * int(keep.sum()), dtype=SCHEMA["tenant"]),
        "prefix_hashes": pl.Series([None] * int(keep.sum()), dtype=SCHEMA["prefix_hashes"]),
    })
    moved = int((order != np.arange(len(order))).sum())
    date = objs[0].get("date")
    origin = f"{start[keep].min():.6f} s (client perf_counter)" + (f", run saved {date}" if date else "")
    return df, dict(path=str(path), format="vllm_bench", rows_read=rows, requests=df.height,
                    failed_requests=rows - df.height, rows_reordered=moved, time_origin=origin)
