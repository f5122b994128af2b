"""`replay(trace, config)`: the one call that replays a canonical trace through the engine model.

Builds the request state and block keys from the trace, resolves the config, picks the executor
and the implementation (`run_engine`: the compiled core where it can run, else the Python reference
with a one-line notice on stderr), runs it and returns the result tables (not yet stored: the store
does that). Same trace + config (+ seed) => identical tables, in and across processes: the run id is
a hash of the trace's content and the config, so a rerun replaces itself in the store.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from datetime import datetime, timezone
from typing import Callable, Literal, Protocol

import numpy as np
import polars as pl

from replay.config import EngineConfig, resolve
from replay.engine import compiled
from replay.engine.prefix import TraceBlockKeys, UniqueBlockKeys, row_offsets
from replay.engine.raw import RawRun
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState
from replay.results.summary import StepStats, SummarySpec, max_tbt_weight
from replay.results.tables import RunResult, build_tables, recompute_tax
from traces.schema import DEFAULT_HASH_BLOCK_TOKENS, has_prefix_hashes, hash_block_tokens

KVCAP_VERSION = "0.1.0"


def trace_sha256(trace: pl.DataFrame) -> str:
    """Content hash of the columns that drive a replay (stable across processes)."""
    h = hashlib.sha256()
    for col in ("arrival_s", "prompt_tokens", "output_tokens", "priority"):
        h.update(trace[col].to_numpy().astype(np.float64 if col == "arrival_s" else np.int64).tobytes())
    if has_prefix_hashes(trace):
        flat = trace["prefix_hashes"].explode().fill_null(0).to_numpy().astype(np.uint64)
        lens = trace["prefix_hashes"].list.len().fill_null(-1).to_numpy().astype(np.int64)
        h.update(flat.tobytes()); h.update(lens.tobytes())
        # The hashes' granularity; the default is left out so earlier run ids stay.
        if (hbt := hash_block_tokens(trace)) != DEFAULT_HASH_BLOCK_TOKENS:
            h.update(f"hash_block_tokens={hbt}".encode())
    return h.hexdigest()


def offered_rps(trace: pl.DataFrame) -> float | None:
    """Requests per second over the arrival span (None for fewer than two distinct arrivals)."""
    if trace.height < 2:
        return None
    span = float(trace["arrival_s"].max()) - float(trace["arrival_s"].min())
    return trace.height / span if span > 0 else None


def run_id_for(trace: pl.DataFrame, config: EngineConfig, *, executor: str = "model",
               stub_options: dict | None = None, sha: str | None = None) -> str:
    """The id `replay()` gives this trace (sorted by arrival) + config + executor: a hash, so a rerun
    finds (and replaces) its earlier self in the store."""
    sha = sha or trace_sha256(trace.sort("arrival_s", maintain_order=True))
    opts = json.dumps(stub_options or {}, sort_keys=True, default=str) if executor == "stub" else ""
    return hashlib.sha256(f"{sha}|{config.config_json()}|{executor}|{opts}".encode()).hexdigest()[:16]


def request_state(trace: pl.DataFrame) -> RequestState:
    return RequestState(arrival_s=trace["arrival_s"].to_numpy(),
                        prompt_len=trace["prompt_tokens"].to_numpy(),
                        output_len=trace["output_tokens"].to_numpy(),
                        priority=trace["priority"].to_numpy())


# The last trace's prefix keys in this process, by content: a search replays one trace at many
# rate scales (only arrival_s changes), and building the keys of a day of Mooncake-like traffic
# (1.65 s for 293k requests, 7M hashes) costs 12% of its replay; hashing what they are built
# from, 0.14 s. The keys are read-only (the cores take them without write access).
_KEYS: dict[str, TraceBlockKeys] = {}


def block_keys(trace: pl.DataFrame, block_size: int):
    """The trace's prefix keys: each hash stands for the trace's `hash_block_tokens` tokens."""
    if not has_prefix_hashes(trace):
        return UniqueBlockKeys()
    lists = trace["prefix_hashes"]
    hashes = lists.explode(empty_as_null=False, keep_nulls=False)    # no Python list per row
    if hashes.null_count():
        raise ValueError("prefix_hashes: a row's list of hashes holds a null")
    lens = lists.list.len().fill_null(0).to_numpy().astype(np.int64)
    flat, prompt, hbt = hashes.to_numpy(), trace["prompt_tokens"].to_numpy(), hash_block_tokens(trace)
    h = hashlib.sha256(f"{block_size}|{hbt}|{flat.dtype}|{prompt.dtype}".encode())
    for a in (flat, lens, prompt):
        h.update(np.ascontiguousarray(a).tobytes())
    key = h.hexdigest()
    if key not in _KEYS:
        keys = TraceBlockKeys.from_flat(block_size=block_size, prompt_len=prompt, hashes=flat,
                                        offsets=row_offsets(lens), hash_block_tokens=hbt)
        for a in (keys.offsets, keys.chain_ids, keys.shared_blocks):
            a.setflags(write=False)
        _KEYS.clear()
        _KEYS[key] = keys
    return _KEYS[key]


def with_v0_warnings(events: pl.DataFrame) -> pl.DataFrame:
    """Add `log_line`: the WARNING vLLM V0 would log for each preemption (1 in 50, reference A5),
    so a replay can be lined up with production logs."""
    from replay.engine.v0.logline import preemption_warning
    pre = events["kind"].str.starts_with("preempt_").to_list()
    lines, cum = [], 0
    for is_pre, rid, kind in zip(pre, events["request_id"].to_list(), events["kind"].to_list()):
        if not is_pre:
            lines.append(None)
            continue
        cum += 1
        lines.append(preemption_warning(str(rid), kind.removeprefix("preempt_"), cum))
    return events.with_columns(log_line=pl.Series(lines, dtype=pl.Utf8))


def make_scheduler(name: str, spec, state, keys):
    """The reference (Python) scheduler of engine `name` ("v0" | "v1")."""
    if name == "v0":
        from replay.engine.v0.scheduler import V0Scheduler
        return V0Scheduler(spec, state, keys)
    from replay.engine.v1.scheduler import V1Scheduler
    return V1Scheduler(spec, state, keys)


Choice = Literal["auto", "compiled", "reference"]
# Steps per chunk a summary replay's core hands over: larger than a store writer's (nothing
# waits on them), ~13 MB of columns, so the per-chunk work is a few hundred calls a day.
SUMMARY_EVERY_STEPS = 1 << 17


class StepSink(Protocol):
    """Where a replay's step and TBT columns go while the compiled core makes them (the store's
    writer, replay/results/writer.py): the run id before the engine starts, then chunk by chunk in
    step order. A reference replay hands it nothing: its tables come whole with the result."""

    def begin_run(self, run_id: str) -> None: ...

    def append(self, steps: dict[str, np.ndarray], tbt: dict[str, np.ndarray]) -> None: ...


def run_engine(engine: str, spec: SchedulerSpec, state: RequestState, keys, executor, *,
               kv_bytes_per_block: int, implementation: Choice = "auto", scheduler=None,
               on_progress: Callable[[float, int], None] | None = None,
               progress_every_steps: int = 20_000,
               record_batches: bool | tuple[int, int] = False,
               spill_dir: str | None = None, sink: compiled.Sink | None = None,
               keep_steps: bool = True) -> RawRun:
    """Replay `state` on one implementation of `engine`: "compiled" (the C core; an error where
    it cannot run), "reference" (the Python scheduler and loop; `scheduler` if already built,
    e.g. for the torch stub) or "auto" (compiled where it can run, else the reference with a
    one-line notice on stderr saying why). `RawRun.implementation` says which ran.
    `spill_dir`: a long compiled run keeps its step and TBT columns in files there
    (`compiled.run`; the reference keeps them in memory). `sink`: a compiled run hands them to
    it chunk by chunk as well (`compiled.run`; the reference does not call it).
    `keep_steps=False` (a summary replay): the step and TBT columns go to `sink` only, chunk by
    chunk from the compiled core, whole from the reference, and the run keeps none."""
    why = None if implementation == "reference" else \
        compiled.unavailable(engine, executor, keys, state, spec)
    if implementation == "compiled" and why:
        raise ValueError(f"the compiled {engine} core cannot run this replay: {why}")
    if implementation != "reference" and why is None:
        return compiled.run(engine, state, spec, executor, keys,
                            kv_bytes_per_block=kv_bytes_per_block, on_progress=on_progress,
                            progress_every_steps=progress_every_steps,
                            record_batches=record_batches, spill_dir=spill_dir, sink=sink,
                            keep_steps=keep_steps,
                            sink_every_steps=None if keep_steps else SUMMARY_EVERY_STEPS)
    if why:
        print(f"kvcap: replaying on the Python reference implementation, tens of times slower "
              f"than the compiled core: {why}", file=sys.stderr)
    from replay.engine import loop      # the reference loop (a compiled replay does not load it)
    sched = scheduler if scheduler is not None else make_scheduler(engine, spec, state, keys)
    raw = loop.run(state, sched, executor, kv_bytes_per_block=kv_bytes_per_block,
                   on_progress=on_progress, progress_every_steps=progress_every_steps,
                   record_batches=record_batches)
    if not keep_steps:
        sink(raw.steps, {"tbt_s": raw.tbt_values, "weight": raw.tbt_weights})
        raw.steps = {k: v[:0] for k, v in raw.steps.items()}
        raw.tbt_values, raw.tbt_weights = raw.tbt_values[:0], raw.tbt_weights[:0]
    return raw


def replay(trace: pl.DataFrame, config: EngineConfig | None = None, *, executor: str = "model",
           implementation: Choice = "auto", label: str | None = None, trace_name: str = "",
           on_progress: Callable[[float, int], None] | None = None, stub_options: dict | None = None,
           record_batches: bool | tuple[int, int] = False, spill_dir: str | None = None,
           step_sink: StepSink | None = None, summary: SummarySpec | None = None,
           rate_scale: float | None = None, arrivals: str | None = None) -> RunResult:
    """Replay `trace` (canonical, sorted by arrival_s) under `config`; `record_batches` adds
    the `batches` table (every step's batch: off by default, it is one row per token step; a
    (first, last) pair of steps records those steps' batches only).
    With `spill_dir`, a long run's `steps` and `tbt` tables stay in files under that folder
    until the store writes them (`results.SpilledTable`; `kvcap replay` does this beside its DB).
    With `step_sink`, a compiled run hands its step and TBT columns to it as it goes (`kvcap
    replay`'s store writer) and its `steps` and `tbt` tables are those chunks.
    With `summary`, the run keeps summaries of its step and TBT columns instead of the columns
    (replay/results/summary.py: `steps` is a `StepSummary`, `tbt` a `TbtSummary`): what a search
    asks of a replay, exactly, in memory bounded by the requests and not by the steps.
    `rate_scale` (the multiple of the source trace's rate `trace` was made at) and `arrivals`
    (the synthetic arrivals given a lengths-only trace, e.g. "poisson:5 seed 0") are recorded
    in the `runs` row, where they tell runs of one source apart (`kvcap runs`)."""
    if summary is not None and (step_sink is not None or spill_dir is not None or record_batches):
        raise ValueError("a summary replay keeps no steps to spill, stream or record batches of")
    config = config or EngineConfig()
    wall0 = time.perf_counter()
    eng = resolve(config)
    if not trace["arrival_s"].is_sorted():      # a sorted trace is not copied (10M rows)
        trace = trace.sort("arrival_s", maintain_order=True)
    state = request_state(trace)
    keys = block_keys(trace, eng.spec.block_size)
    scheduler = None
    if executor == "model":
        from replay.timing.executors import cost_model_for
        ex = cost_model_for(eng, calibration=config.calibration)
    elif executor == "stub":
        from replay.stub.executor import StubExecutor
        # The stub reads and writes through the reference scheduler's block tables.
        scheduler = make_scheduler(config.scheduler, eng.spec, state, keys)
        ex = StubExecutor.for_engine(eng, state=state, scheduler=scheduler, keys=keys,
                                     **(stub_options or {}))
    else:
        raise ValueError(f"executor {executor!r}: use 'model' or 'stub'")
    spec = eng.spec
    link = getattr(getattr(ex, "constants", None), "host_link_bytes_per_s", None)
    if spec.kv_offloading and link and scheduler is None:
        # Offload transfers take the host link the executor prices (a calibrated one included).
        spec = dataclasses.replace(spec, offload_host_link_bytes_per_s=float(link))
    sha = run_id = None
    stats = None if summary is None else StepStats(summary,
                                                   max_weight=max_tbt_weight(state.output_len))
    if step_sink is not None:
        sha = trace_sha256(trace)
        run_id = run_id_for(trace, config, executor=executor, stub_options=stub_options, sha=sha)
        step_sink.begin_run(run_id)
    raw = run_engine(config.scheduler, spec, state, keys, ex,
                     kv_bytes_per_block=eng.kv_bytes_per_block,
                     implementation=implementation, scheduler=scheduler, on_progress=on_progress,
                     record_batches=record_batches, spill_dir=spill_dir,
                     sink=(stats.append if stats is not None
                           else step_sink.append if step_sink is not None else None),
                     keep_steps=stats is None)
    res = result_of(raw, trace, config, eng, executor=executor, label=label,
                    trace_name=trace_name, wall0=wall0, stub_options=stub_options,
                    run_id=run_id, sha=sha, rate_scale=rate_scale, arrivals=arrivals)
    if stats is None:
        return res
    steps, tbt = stats.finish()
    return dataclasses.replace(res, steps=steps, tbt=tbt)


def result_of(raw: RawRun, trace: pl.DataFrame, config: EngineConfig, eng, *, executor: str,
              label: str | None, trace_name: str, wall0: float, stub_options: dict | None = None,
              run_id: str | None = None, sha: str | None = None,
              rate_scale: float | None = None, arrivals: str | None = None) -> RunResult:
    """The result tables of a finished replay of `trace` (sorted) under `config` (resolved:
    `eng`); `run_id` overrides the content hash (a fleet's replicas: replay/fleet/run.py); `sha`:
    the trace's content hash, if already computed."""
    sha = sha or trace_sha256(trace)
    cfg_json = config.config_json()
    run_id = run_id or run_id_for(trace, config, executor=executor, stub_options=stub_options,
                                  sha=sha)
    tables = build_tables(raw, trace, run_id)
    if config.scheduler == "v0":
        tables["events"] = with_v0_warnings(tables["events"])
    spec = eng.spec
    run = {
        "run_id": run_id, "created_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "label": label or "", "trace_name": trace_name, "trace_sha256": sha,
        "num_requests": trace.height, "scheduler": config.scheduler, "model": eng.model.name,
        "gpu": eng.gpu.name, "tp": config.tensor_parallel_size, "block_size": spec.block_size,
        "num_gpu_blocks": spec.num_gpu_blocks, "num_cpu_blocks": spec.num_cpu_blocks,
        "max_num_seqs": spec.max_num_seqs, "max_num_batched_tokens": spec.max_num_batched_tokens,
        "preemption_mode": spec.preemption_mode, "swap_space_gib": float(config.swap_space),
        "on_swap_full": spec.on_swap_full, "executor": executor, "status": raw.status,
        "sim_seconds": raw.sim_seconds, "wall_seconds": time.perf_counter() - wall0,
        "config_json": cfg_json, "kvcap_version": KVCAP_VERSION, "num_steps": raw.num_steps,
        "kv_bytes_per_block": eng.kv_bytes_per_block, "abort_s": raw.abort_s,
        "abort_reason": raw.abort_reason, "implementation": raw.implementation,
        # V1's engine loop (None on V0, which has one).
        "async_scheduling": spec.async_scheduling if config.scheduler == "v1" else None,
        # Whether vLLM's CPU KV OffloadingConnector was on (num_cpu_blocks is then its chunks).
        "kv_offloading": spec.kv_offloading,
        # Prompt tokens per prefix hash of the trace (None: no prefix hashes).
        "hash_block_tokens": hash_block_tokens(trace) if has_prefix_hashes(trace) else None,
        # The vLLM release replayed: 0.10.1.1 (V0), 0.33 or 0.34 (V1).
        "vllm_version": eng.vllm_version,
        # What was offered: requests per second of arrival span; the multiple of the source
        # trace's rate (None: not said by the caller) and synthetic arrivals (None: the trace's).
        "offered_rps": offered_rps(trace), "rate_scale": rate_scale, "arrivals": arrivals,
        # Prefill tokens recomputed after preemption over all prefill tokens.
        "recompute_tax": recompute_tax(tables["requests"], tables["steps"]),
    }
    return RunResult(run=run, **tables)
