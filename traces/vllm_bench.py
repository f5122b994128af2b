"""`vllm bench serve` output: the one reader of its files, and the file as a trace.

vLLM's serving benchmark (`vllm/benchmarks/serve.py`; `benchmarks/benchmark_serving.py` before)
saved with `--save-result --save-detailed` writes one JSON object per run with per-request lists
`start_times` (its client's `time.perf_counter()` at each send), `input_lens`, `output_lens`,
`ttfts`, `itls` and `errors`; with `--append-result` a file holds one such object per line (one run
each); its per-request `RequestFuncOutput` rows (`start_time`, `prompt_len`, `output_tokens`,
`ttft`, `itl`, `success`, `error`) as JSONL are one run too. `read_runs` reads all three into
`BenchRun`s; three consumers apply their own rules to them: the trace here (`load_result`), the
client timings of `kvcap logs` (capacity.evidence.clientparse) and `kvcap calibrate --from-bench`
(replay.calibration.bench_fit).

As a trace: arrival = start time minus the earliest one, prompt = input_len, output = output_len. A
request that failed (`errors[i]` non-empty, or no output) produced no output, so it does not enter
the trace; it is counted in `LoadReport.failed_requests`, as BurstGPT failures are. `request_id` is
the 0-based index in the file (runs in order), the same index `kvcap logs` gives that request's
client timings.
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from traces.schema import SCHEMA, TraceError

LIST_KEYS = ("start_times", "input_lens", "output_lens", "ttfts", "itls", "errors")
_NUMBER_KEYS = ("start_times", "input_lens", "output_lens", "ttfts")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRun:
    """One benchmark run as saved. Numbers are float arrays with NaN where the file has null; a key
    the run did not save is not in `saved` (its array is all NaN)."""
    where: str                  # "FILE" or "FILE, run K": how messages name the run
    raw: dict                   # the result object (messages quote its values)
    saved: frozenset[str]       # which of LIST_KEYS the run has
    start_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    ttft_s: np.ndarray
    itl_s: np.ndarray           # every request's gaps, one after the other (CSR with itl_offsets)
    itl_offsets: np.ndarray     # request i's gaps: itl_s[itl_offsets[i]:itl_offsets[i + 1]]
    failed: np.ndarray          # errors[i] non-empty (vLLM's own metrics skip these)

    @property
    def n(self) -> int:
        return len(self.input_len)

    def value(self, key: str, i: int):
        """What the file holds at `key`[i], for messages."""
        return self.raw[key][i]


def read_runs(path: Path, *, rows: bool = True) -> list[BenchRun] | None:
    """The runs of a `vllm bench serve` output file, or None when it is none (so other readers may
    try it; with `rows` False also for per-request rows, which the trace loader maps as columns).
    Bad JSON or a malformed run is a TraceError naming the file, line and key."""
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return None
    if head.lstrip()[:1] != b"{":
        return None
    result = b'"input_lens"' in head or b'"ttfts"' in head
    if not (result or rows and b'"ttft"' in head and b'"itl"' in head):
        return None
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    try:
        objs = [json.loads(text)]
    except json.JSONDecodeError:
        objs = _json_lines(path, text)
    for lineno, obj in enumerate(objs, 1):
        if not isinstance(obj, dict):
            raise TraceError(f"{path}, line {lineno}: expected a vllm bench result object, got "
                             f"{type(obj).__name__}")
    if not result:                       # per-request rows: one run
        return [run_from_object(_rows_as_result(objs), str(path))]
    return [run_from_object(obj, f"{path}, run {k}" if len(objs) > 1 else str(path))
            for k, obj in enumerate(objs, 1)]


def _json_lines(path: Path, text: str) -> list:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}, line {lineno}, column {exc.colno}: invalid JSON "
                                 f"({exc.msg})") from None
    return out


def _rows_as_result(rows: list[dict]) -> dict:
    """Per-request rows -> the result object's per-request lists (a failed row keeps its error)."""
    def err(r: dict) -> str:
        return "" if r.get("success", True) and not r.get("error") else (r.get("error") or "failed")
    return {"start_times": [r.get("start_time") for r in rows],
            "input_lens": [r.get("prompt_len") for r in rows],
            "output_lens": [r.get("output_tokens") for r in rows],
            "ttfts": [r.get("ttft") for r in rows], "itls": [r.get("itl") or [] for r in rows],
            "errors": [err(r) for r in rows]}


def run_from_object(obj: dict, where: str) -> BenchRun:
    """One result object as a BenchRun: every saved list as long as the others, numbers numbers."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a vllm bench result object, got {type(obj).__name__}")
    saved = [k for k in LIST_KEYS if obj.get(k) is not None]
    for k in saved:
        if not isinstance(obj[k], list):
            raise TraceError(f"{where}, key '{k}': expected a list, got {type(obj[k]).__name__}")
    first = next((k for k in ("input_lens", "ttfts", *saved) if k in saved), None)
    n = len(obj[first]) if first else 0
    for k in saved:
        if len(obj[k]) != n:
            raise TraceError(f"{where}, key '{k}': {len(obj[k])} entries, '{first}' has {n}")
    cols = {k: _numbers(obj[k], k, where) if k in saved else np.full(n, np.nan)
            for k in _NUMBER_KEYS}
    itls = obj["itls"] if "itls" in saved else [[]] * n
    bad = next((i for i, v in enumerate(itls) if not isinstance(v, list)), None)
    if bad is not None:
        raise TraceError(f"{where}, key 'itls', request {bad}: expected a list of seconds, got "
                         f"{itls[bad]!r}")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(v) for v in itls], out=offsets[1:])
    flat = list(itertools.chain.from_iterable(itls))
    try:
        itl = np.array(flat, dtype=float)
    except (TypeError, ValueError):
        j = next(j for j, v in enumerate(flat) if not _is_number(v))
        i = int(np.searchsorted(offsets, j, side="right")) - 1
        raise TraceError(f"{where}, key 'itls', request {i}: {flat[j]!r} is not a number "
                         "(seconds)") from None
    errors = obj["errors"] if "errors" in saved else [""] * n
    return BenchRun(where=where, raw=obj, saved=frozenset(saved), start_s=cols["start_times"],
                    input_len=cols["input_lens"], output_len=cols["output_lens"],
                    ttft_s=cols["ttfts"], itl_s=itl, itl_offsets=offsets,
                    failed=np.array([bool(e) for e in errors], dtype=bool))


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers(values: list, key: str, where: str) -> np.ndarray:
    """A list of numbers (null -> NaN); anything else names the key and the request."""
    bad = next((i for i, v in enumerate(values) if v is not None and not _is_number(v)), None)
    if bad is not None:
        raise TraceError(f"{where}, key '{key}', request {bad}: {values[bad]!r} is not a number")
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def first_bad(run: BenchRun, key: str, bad: np.ndarray, what: str) -> None:
    """Raise naming the first request where `bad` holds (a TraceError naming key and request)."""
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"{run.where}, key '{key}', request {i}: {run.value(key, i)!r} {what}")


def load_result(path: Path, runs: list[BenchRun]) -> tuple[pl.DataFrame, dict]:
    """(canonical trace, the fields of its traces.loaders.LoadReport) of a vllm bench result file."""
    starts, ins, outs, failed_mask = [], [], [], []
    for run in runs:
        missing = [k for k in ("input_lens", "output_lens") if k not in run.saved]
        if missing:
            raise TraceError(f"{run.where}: no '{missing[0]}': save the benchmark with --save-result "
                             "--save-detailed to replay it")
        if "start_times" not in run.saved:
            raise TraceError(f"{run.where}: no 'start_times' (vLLM releases before they were saved): "
                             "the arrival times are unknown; replay it with a synthetic arrival "
                             "process instead")
        for key, v in (("start_times", run.start_s), ("input_lens", run.input_len),
                       ("output_lens", run.output_len)):
            first_bad(run, key, ~np.isfinite(v) | (v < 0), "is not a finite number >= 0")
        p, o = run.input_len, run.output_len
        whole = (p == np.floor(p)) & (o == np.floor(o)) & (p >= 1)
        if not whole.all():
            i = int(np.argmin(whole))
            raise TraceError(f"{run.where}, request {i}: lengths must be whole numbers, prompt >= 1 "
                             f"(input_len {run.value('input_lens', i)!r}, output_len "
                             f"{run.value('output_lens', i)!r})")
        starts.append(run.start_s)
        ins.append(p.astype(np.int64))
        outs.append(o.astype(np.int64))
        failed_mask.append(run.failed | (o == 0))
    start = np.concatenate(starts)
    rows = len(start)
    if rows == 0:
        raise TraceError(f"{path}: the benchmark result holds no requests")
    keep = ~np.concatenate(failed_mask)
    if not keep.any():
        raise TraceError(f"{path}: all {rows} requests failed; nothing to replay")
    ids = np.arange(rows)[keep]
    arrival = start[keep] - start[keep].min()
    order = np.argsort(arrival, kind="stable")
    n = int(keep.sum())
    df = pl.DataFrame({
        "request_id": pl.Series(ids[order], dtype=SCHEMA["request_id"]),
        "arrival_s": pl.Series(arrival[order], dtype=pl.Float64),
        "prompt_tokens": pl.Series(np.concatenate(ins)[keep][order], dtype=SCHEMA["prompt_tokens"]),
        "output_tokens": pl.Series(np.concatenate(outs)[keep][order], dtype=SCHEMA["output_tokens"]),
        "priority": pl.Series([0] * n, dtype=SCHEMA["priority"]),
        "tenant": pl.Series([None] * n, dtype=SCHEMA["tenant"]),
        "prefix_hashes": pl.Series([None] * n, dtype=SCHEMA["prefix_hashes"]),
    })
    moved = int((order != np.arange(len(order))).sum())
    date = runs[0].raw.get("date")
    origin = f"{start[keep].min():.6f} s (client perf_counter)" + (f", run saved {date}" if date else "")
    return df, dict(path=str(path), format="vllm_bench", rows_read=rows, requests=df.height,
                    failed_requests=rows - df.height, rows_reordered=moved, time_origin=origin)
