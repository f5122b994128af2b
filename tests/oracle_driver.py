"""Drive a kvcap scheduler through an oracle scenario (../shared/oracle) the way oracle.py drives
real vLLM, and print the same per-step lines, so tests can compare them with `expected/`.

The loop per step: add the requests arriving at this step (file order), apply aborts, schedule(),
then play the model's output back (update()). Schedulers expose two test hooks:
`abort_request(row)` and `snapshot()` -> {"waiting", "running", "swapped": [rows],
"free_gpu", "free_cpu": int | None, "blocks": {row: [block ids]}, "computed": {row: int} (V1),
"kv_usage": float (V1)} with block ids as vLLM prints them (V0 host blocks offset by num_gpu_blocks).

CPU KV offloading (V1 `kv_offloading` scenarios O*, oracle README §4). The plan carries the
connector's decisions of the step (`StepPlan.offload`: lookups, hits, loads, stores, evicted,
store_failed, flushed), the output the
transfers it reports done (`StepOutput.offload_done`), and `snapshot()` adds:
"free_cpu": tier chunks holding no data (pending and evictable ones count as used),
"waiting_for_kv": [rows in WAITING_FOR_REMOTE_KVS], "cpu_pending": int (chunks whose store is in
flight), and "cpu_lru": [chunk keys, next victim first] (LRU) or "cpu_arc": {"t1": [keys], "t2":
[keys], "b1": int, "b2": int, "target_t1": float} (ARC; T1 and T2 least recently used first).
`waiting` lists the waiting requests that hold blocks (loading) first. Chunks are printed
"R:i" as the oracle names them: chunk i of the first request R that stored that key.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from replay.engine.prefix import TokenBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState, Status

ORACLE = Path(__file__).resolve().parents[2] / "shared" / "oracle"
# Real vLLM's outputs per modelled release (oracle README §8: 0.34 is `--engine v1-034`).
EXPECTED = {"0.33": ORACLE / "expected", "0.34": ORACLE / "expected-034"}
V0_SCENARIOS = sorted(p.stem for p in (ORACLE / "scenarios").glob("S*.json")
                      if int(p.stem[1:].rstrip("abcdefghijklmnopqrstuvwxyz_").split("_")[0]) <= 12)
V1_SCENARIOS = sorted(p.stem for p in (ORACLE / "scenarios").glob("S*.json")
                      if p.stem not in V0_SCENARIOS)
# V1 with CPU KV offloading (and O8_nocpu, its baseline without it).
OFFLOAD_SCENARIOS = sorted(p.stem for p in (ORACLE / "scenarios").glob("O*.json"))
# 0.34 only: cache-aware admission (C*, no connector) and the in-flight load cap (L*).
V1_034_ONLY = sorted(p.stem for p in (ORACLE / "scenarios").glob("C*.json"))
OFFLOAD_034_ONLY = sorted(p.stem for p in (ORACLE / "scenarios").glob("L*.json"))
# The scenario's 0.34 scheduler knobs (README §3), SchedulerSpec's names. kvcap's what-if
# `preemption_victim` (no vLLM release has it, so no oracle file sets it) passes through too.
KNOBS_034 = ("cache_aware_admission_window", "cache_aware_admission_threshold",
             "max_num_inflight_kv_loads")


def expected_names(version: str) -> list[str]:
    """Every scenario real vLLM `version` has an output for (V1 runs: 0.33's expected/ also
    holds V0's)."""
    return sorted(p.stem for p in EXPECTED[version].glob("*.jsonl"))


def v1_scenarios(version: str) -> list[str]:
    """The V1 scenarios without a connector that `version` has outputs for (S13.., C*)."""
    have = set(expected_names(version))
    return [n for n in V1_SCENARIOS + V1_034_ONLY if n in have]


def offload_scenarios(version: str) -> list[str]:
    """The V1 connector scenarios (O*, L*) that `version` has outputs for."""
    have = set(expected_names(version))
    return [n for n in OFFLOAD_SCENARIOS + OFFLOAD_034_ONLY if n in have]
# The oracle's `kv_offloading` fields kvcap models (README §3); the others must stay at their
# defaults.
_OFFLOAD_DEFAULTS = {"eviction_policy": "lru", "offload_prompt_only": True, "blocks_per_chunk": 1,
                     "store_threshold": 0, "transfer_steps": 1, "extra_config": {}}


def v1_implementations() -> dict:
    """The two V1 implementations every parity test steps through the same contract: the Python
    reference scheduler and the compiled core (`StepCore`)."""
    from replay.engine.compiled import StepCore
    from replay.engine.v1 import V1Scheduler
    return {"reference": V1Scheduler,
            "compiled": lambda spec, state, keys: StepCore("v1", spec, state, keys)}


def load_case(path: Path) -> tuple[dict, list[dict]]:
    """A self-contained case file: its scenario on the first line, real vLLM's steps after."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x]
    return lines[0], lines[1:]


def load(name: str, version: str = "0.33") -> tuple[dict, list[dict]]:
    """The scenario and real vLLM `version`'s output for it (expected/ for 0.33, expected-034/
    for 0.34); the scenario records the version it is to be driven as (`vllm_version`)."""
    sc = json.loads((ORACLE / "scenarios" / f"{name}.json").read_text())
    lines = (EXPECTED[version] / f"{name}.jsonl").read_text().splitlines()
    return {**sc, "vllm_version": version}, [json.loads(x) for x in lines if x.strip()]


def prompt_ids(req: dict, idx: int) -> list[int]:
    toks = req.get("prompt_token_ids", req.get("prompt_tokens"))
    if isinstance(toks, list):
        return [int(t) for t in toks]
    return [(idx + 1) * 100_000 + i for i in range(int(toks))]


def out_token(idx: int, k: int) -> int:
    return 9_000_000 + idx * 10_000 + k


def build(sc: dict, engine: str, *, arrival_at_step: bool = False,
          arrival_ties: str = "trace_order"):
    """SchedulerSpec, RequestState, request ids and block keys for a scenario, as vLLM
    `sc["vllm_version"]` (`load` sets it; 0.33 when absent) runs it: a 0.34 knob on 0.33 is a
    ValueError (the oracle's `config_error`). `arrival_at_step`: each request arrives at time
    `arrival_step` exactly (a replay loop whose steps take 1 s then takes step k at time k;
    same-step arrivals tie and enter in file order). `arrival_ties` (SchedulerSpec): "equal"
    takes equal arrival times as vLLM got them (an oracle file: running order picks among them),
    "trace_order" as a trace's ties (vLLM's receipt times would be distinct, tests/test_ties.py)."""
    v1 = engine == "v1"
    mode = sc.get("preemption_mode")
    off = sc.get("kv_offloading") if v1 else None
    offload = {}
    if off is not None:
        o = {**_OFFLOAD_DEFAULTS, **off}
        unknown = set(o) - set(_OFFLOAD_DEFAULTS) - {"num_cpu_blocks"}
        if unknown or o["extra_config"]:
            raise ValueError(f"kv_offloading: {sorted(unknown) or 'extra_config'} not modelled")
        offload = dict(kv_offloading=True, num_cpu_blocks=int(o["num_cpu_blocks"]),
                       offload_prompt_only=bool(o["offload_prompt_only"]),
                       offload_eviction_policy=o["eviction_policy"],
                       offload_blocks_per_chunk=int(o["blocks_per_chunk"]),
                       offload_store_threshold=int(o["store_threshold"]),
                       offload_transfer_steps=int(o["transfer_steps"]))
    spec = SchedulerSpec(
        block_size=sc["block_size"], num_gpu_blocks=sc["num_gpu_blocks"],
        num_cpu_blocks=offload.pop("num_cpu_blocks", sc.get("num_cpu_blocks") or 0),
        max_num_seqs=sc["max_num_seqs"],
        max_num_batched_tokens=sc["max_num_batched_tokens"], max_model_len=sc["max_model_len"],
        enable_chunked_prefill=bool(sc.get("chunked_prefill", v1)),
        enable_prefix_caching=bool(sc.get("prefix_caching", v1)),
        policy=sc.get("policy", "fcfs"),
        preemption_mode="recompute" if (v1 or mode in (None, "null")) else mode,
        on_swap_full="abort",
        # A scenario names its engine loop (the oracle's default is the synchronous one).
        async_scheduling=v1 and bool(sc.get("async_scheduling", False)),
        **{k: sc[k] for k in ("long_prefill_token_threshold", "scheduler_reserve_full_isl",
                               "watermark", "max_num_active_seqs", *KNOBS_034,
                               "preemption_victim")
           if k in sc and v1},
        vllm_version=sc.get("vllm_version", "0.33") if v1 else "0.33",
        arrival_ties=arrival_ties,
        **offload)
    reqs = sc["requests"]
    ids = [str(r["id"]) for r in reqs]
    arrival = [float(r["arrival_step"]) if arrival_at_step else
               float(r["arrival_time"]) if r.get("arrival_time") is not None
               else float(r["arrival_step"]) + i * 1e-6 for i, r in enumerate(reqs)]
    prompts = [prompt_ids(r, i) for i, r in enumerate(reqs)]
    state = RequestState(arrival_s=np.array(arrival),
                         prompt_len=np.array([len(p) for p in prompts]),
                         output_len=np.array([int(r["output_tokens"]) for r in reqs]),
                         priority=np.array([int(r.get("priority", 0)) for r in reqs]))

    def tokens(row: int) -> list[int]:
        return prompts[row] + [out_token(row, k) for k in range(int(state.num_output[row]))]

    def all_tokens(row: int) -> list[int]:
        # The whole sequence is known in advance (outputs are a function of the request), so the
        # compiled cores can take every block key precomputed.
        return prompts[row] + [out_token(row, k) for k in range(int(state.output_len[row]))]

    keys = TokenBlockKeys(block_size=spec.block_size, tokens=tokens, all_tokens=all_tokens)
    return spec, state, ids, keys


def batch_kinds(plan) -> list[str]:
    """The plan's kind per row, as `batches.kind` names it (replay.engine.raw.BATCH_KINDS)."""
    from replay.engine.raw import BATCH_KINDS
    if plan.kind is None:
        return ["prefill" if p else "decode" for p in plan.is_prefill.tolist()]
    return [BATCH_KINDS[k] for k in plan.kind.tolist()]


def drive(make_scheduler, sc: dict, engine: str, *, inspect=None,
          arrival_ties: str = "trace_order") -> list[dict]:
    """Run the scenario; `make_scheduler(spec, state, keys)` builds the scheduler under test;
    `inspect(state, ids)`, if given, sees the request counters at the end; `arrival_ties` as in
    `build`."""
    spec, state, ids, keys = build(sc, engine, arrival_ties=arrival_ties)
    sched = make_scheduler(spec, state, keys)
    reqs = sc["requests"]
    last_arrival = max(int(r["arrival_step"]) for r in reqs)
    cum = 0
    out: list[dict] = []
    name = lambda rows: [ids[r] for r in rows]  # noqa: E731
    offloading = spec.kv_offloading
    tell = getattr(sched, "tell_time", None)
    chunk_names: dict[int, str] = {}     # offload key -> "R:i", named by its first storer

    def chunks(t) -> list[str]:
        for i, k in zip(t.chunks, t.keys):
            chunk_names.setdefault(k, f"{ids[t.row]}:{i}")
        return [chunk_names[k] for k in t.keys]
    prev_rows: list[int] = []            # the batch in flight (async): its output comes next
    for step in range(1, int(sc.get("max_steps", 200)) + 1):
        for row, r in enumerate(reqs):
            if int(r["arrival_step"]) == step:
                sched.add_request(row)
        aborted = set()
        for row, r in enumerate(reqs):
            if r.get("abort_step") is not None and int(r["abort_step"]) == step:
                if state.status[row] in (Status.RUNNING, Status.WAITING):
                    aborted.add(row)
                sched.abort_request(row)
        was_preempted = {r for r in range(state.n) if state.status[r] == Status.WAITING
                         and state.num_preemptions[r] > 0}
        was_waiting = {r for r in range(state.n) if state.status[r] == Status.WAITING}
        if tell is not None:
            tell(step - 1.0)     # step k runs from time k-1 to k (timed offload transfers)
        plan = sched.schedule()
        snap = sched.snapshot()
        if plan.abort is not None:
            out.append({"step": step, "abort_victim": ids[plan.abort.row],
                        "waiting": name(snap["waiting"]), "running": name(snap["running"]),
                        "swapped": name(snap["swapped"]), "free_gpu": snap["free_gpu"],
                        "free_cpu": snap["free_cpu"]})
            break
        cum += len(plan.preempted)
        # The scheduler's own batch kinds (what `batches.kind` records), checked against the
        # kinds the queues imply: the oracle labels a request by its status before schedule().
        kinds = batch_kinds(plan)
        implied = (["prefill" if p else "decode" for p in plan.is_prefill] if engine == "v0" else
                   ["resumed" if r in was_preempted else "new" if r in was_waiting else "running"
                    for r in plan.rows.tolist()])
        assert kinds == implied, f"step {step}: plan kinds {kinds}, queues imply {implied}"
        line = {
            "step": step,
            "scheduled": [[ids[r], int(n), k] for r, n, k in
                          zip(plan.rows.tolist(), plan.num_new_tokens.tolist(), kinds)],
            "num_batched_tokens": plan.num_batched_tokens,
            "preempted": [[ids[p.row], p.mode] + (["priority"] if p.by_priority else [])
                          for p in plan.preempted],
            "swap_out": plan.swap_out.tolist(), "swap_in": plan.swap_in.tolist(),
            "ignored": [ids[x.row] for x in plan.rejected],
            "waiting": name(snap["waiting"]), "running": name(snap["running"]),
            "swapped": name(snap["swapped"]),
            "free_gpu": snap["free_gpu"], "free_cpu": snap["free_cpu"],
            "blocks": {ids[r]: list(b) for r, b in snap["blocks"].items()},
        }
        if engine == "v0":
            line["preempted_metric"] = sum(not p.by_priority for p in plan.preempted)
            line["cum_preemptions"] = cum
        else:
            line["computed"] = {ids[r]: int(c) for r, c in snap["computed"].items()}
        ca = getattr(sched, "cache_aware", None)
        if ca is not None:
            line["cache_aware"] = {"usage": round(ca["usage"], 4),
                                   "cached": {ids[r]: t for r, t in ca["cached"].items()},
                                   "before": name(ca["before"]), "after": name(ca["after"])}
        if offloading:
            line["waiting_for_kv"] = name(snap["waiting_for_kv"])
            off = plan.offload
            line["cpu_lookup"] = {ids[r]: t for r, t in off.lookups}
            line["cpu_hit"] = {ids[r]: [g, c] for r, g, c in off.hits}
            line["cpu_load"] = [[ids[t.row], t.num_tokens, list(t.gpu_blocks), chunks(t)]
                                for t in off.loads]
            line["cpu_store"] = [[ids[t.row], list(t.gpu_blocks), chunks(t)] for t in off.stores]
            line["cpu_evict"] = [chunk_names[k] for k in off.evicted]
            line["cpu_store_failed"] = name(off.store_failed)
            line["cpu_flush"] = name(off.flushed)
        if tell is not None:
            tell(float(step))
        res = sched.update(plan)
        end = sched.snapshot()
        line["finished"] = name(res.finished.tolist())
        if spec.async_scheduling:
            # The oracle lists the requests of the batch whose output it applies that are gone
            # by then: an aborted one too, in that batch's order.
            gone = set(res.finished.tolist()) | aborted
            line["finished"] = name([r for r in prev_rows if r in gone])
            prev_rows = plan.rows.tolist()
        line["free_gpu_end"] = end["free_gpu"]
        line["free_cpu_end"] = end["free_cpu"]
        if engine == "v1":
            line["kv_usage"] = round(end["kv_usage"], 4)
        if offloading:
            line["cpu_done"] = [[ids[r], kind] for r, kind in res.offload_done]
            line["cpu_pending_end"] = end["cpu_pending"]
            if "cpu_lru" in end:
                line["cpu_lru_end"] = [chunk_names[k] for k in end["cpu_lru"]]
            else:
                arc = end["cpu_arc"]
                line["cpu_arc_end"] = {"t1": [chunk_names[k] for k in arc["t1"]],
                                       "t2": [chunk_names[k] for k in arc["t2"]],
                                       "b1": arc["b1"], "b2": arc["b2"],
                                       "target_t1": float(arc["target_t1"])}
        out.append(line)
        if step >= last_arrival and not sched.has_unfinished():
            break
    if inspect is not None:
        inspect(state, ids)
    return out


COMPARED_V0 = ("scheduled", "num_batched_tokens", "preempted", "preempted_metric", "swap_out",
               "swap_in", "ignored", "waiting", "running", "swapped", "free_gpu", "free_cpu",
               "blocks", "finished", "free_gpu_end", "free_cpu_end", "cum_preemptions")
COMPARED_V1 = ("scheduled", "num_batched_tokens", "preempted", "waiting", "running", "free_gpu",
               "computed", "blocks", "finished", "free_gpu_end", "kv_usage")
# With `kv_offloading` (compared where the expected line has them).
COMPARED_OFFLOAD = ("free_cpu", "free_cpu_end", "waiting_for_kv", "cpu_lookup", "cpu_hit",
                    "cpu_load", "cpu_store", "cpu_evict", "cpu_store_failed", "cpu_flush",
                    "cpu_done", "cpu_pending_end", "cpu_lru_end", "cpu_arc_end")
COMPARED_ABORT = ("abort_victim", "waiting", "running", "swapped", "free_gpu", "free_cpu")


# Fields that name chunks "R:i" (oracle README §4).
CHUNK_FIELDS = ("cpu_load", "cpu_store", "cpu_evict", "cpu_lru_end", "cpu_arc_end")


def chunks_by_content(sc: dict):
    """A function renaming the chunks of an output line by content. The oracle names a chunk
    after the first request that offered it (its probe labels every key of a prepare_store call,
    also a failed one), the driver after the first that stored it; both name the same key, the
    prefix of tokens it ends, so each "R:i" becomes the first request, in trace order, whose
    tokens begin with that prefix."""
    bs = sc["block_size"] * (sc.get("kv_offloading") or {}).get("blocks_per_chunk", 1)
    reqs = sc["requests"]
    toks = {str(r["id"]): prompt_ids(r, i) + [out_token(i, k) for k in range(r["output_tokens"])]
            for i, r in enumerate(reqs)}
    first: dict[tuple, str] = {}
    for r in reqs:
        t = toks[str(r["id"])]
        for i in range(len(t) // bs):
            first.setdefault(tuple(t[:(i + 1) * bs]), f"{r['id']}:{i}")

    def name(label: str) -> str:
        rid, i = label.rsplit(":", 1)
        return first.get(tuple(toks[rid][:(int(i) + 1) * bs]), label)

    def line(x: dict) -> dict:
        x = dict(x)
        for f in CHUNK_FIELDS:
            v = x.get(f)
            if v is None:
                continue
            if f in ("cpu_load", "cpu_store"):
                x[f] = [t[:-1] + [[name(c) for c in t[-1]]] if t[-1] != "sync" else
                        t[:-2] + [[name(c) for c in t[-2]], "sync"] for t in v]
            elif f == "cpu_arc_end":
                x[f] = {**v, "t1": [name(c) for c in v["t1"]], "t2": [name(c) for c in v["t2"]]}
            else:
                x[f] = [name(c) for c in v]
        return x
    return line



def compare(got: list[dict], want: list[dict], engine: str) -> list[str]:
    """Differences as readable strings (empty when equal)."""
    diffs = []
    if len(got) != len(want):
        diffs.append(f"steps: got {len(got)}, want {len(want)}")
    for g, w in zip(got, want):
        keys = COMPARED_ABORT if "abort" in w else (COMPARED_V0 if engine == "v0" else
                                                    COMPARED_V1 + (COMPARED_OFFLOAD if
                                                                   "cpu_lookup" in w else ()))
        for k in keys:
            if k in w and g.get(k) != w[k]:
                diffs.append(f"step {w['step']} {k}: got {g.get(k)!r}, want {w[k]!r}")
    return diffs
