"""Drive a kvcap scheduler through an oracle scenario (../shared/oracle) the way oracle.py drives
real vLLM, and print the same per-step lines, so tests can compare them with `expected/`.

The loop per step: add the requests arriving at this step (file order), apply aborts, schedule(),
then play the model's output back (update()). Schedulers expose two test hooks:
`abort_request(row)` and `snapshot()` -> {"waiting", "running", "swapped": [rows],
"free_gpu", "free_cpu": int | None, "blocks": {row: [block ids]}, "computed": {row: int} (V1),
"kv_usage": float (V1)} with block ids as vLLM prints them (V0 host blocks offset by num_gpu_blocks).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from replay.prefix import TokenBlockKeys
from replay.spec import SchedulerSpec
from replay.state import RequestState, Status

ORACLE = Path(__file__).resolve().parents[2] / "shared" / "oracle"
V0_SCENARIOS = sorted(p.stem for p in (ORACLE / "scenarios").glob("S*.json")
                      if int(p.stem[1:].rstrip("abcdefghijklmnopqrstuvwxyz_").split("_")[0]) <= 12)
V1_SCENARIOS = sorted(p.stem for p in (ORACLE / "scenarios").glob("S*.json")
                      if p.stem not in V0_SCENARIOS)


def load(name: str) -> tuple[dict, list[dict]]:
    sc = json.loads((ORACLE / "scenarios" / f"{name}.json").read_text())
    lines = (ORACLE / "expected" / f"{name}.jsonl").read_text().splitlines()
    return sc, [json.loads(x) for x in lines if x.strip()]


def prompt_ids(req: dict, idx: int) -> list[int]:
    toks = req.get("prompt_token_ids", req.get("prompt_tokens"))
    if isinstance(toks, list):
        return [int(t) for t in toks]
    return [(idx + 1) * 100_000 + i for i in range(int(toks))]


def out_token(idx: int, k: int) -> int:
    return 9_000_000 + idx * 10_000 + k


def build(sc: dict, engine: str, *, arrival_at_step: bool = False):
    """SchedulerSpec, RequestState, request ids and block keys for a scenario. `arrival_at_step`:
    each request arrives at time `arrival_step` exactly (a replay loop whose steps take 1 s then
    takes step k at time k; same-step arrivals tie and enter in file order)."""
    v1 = engine == "v1"
    mode = sc.get("preemption_mode")
    spec = SchedulerSpec(
        block_size=sc["block_size"], num_gpu_blocks=sc["num_gpu_blocks"],
        num_cpu_blocks=sc.get("num_cpu_blocks") or 0, max_num_seqs=sc["max_num_seqs"],
        max_num_batched_tokens=sc["max_num_batched_tokens"], max_model_len=sc["max_model_len"],
        enable_chunked_prefill=bool(sc.get("chunked_prefill", v1)),
        enable_prefix_caching=bool(sc.get("prefix_caching", v1)),
        policy=sc.get("policy", "fcfs"),
        preemption_mode="recompute" if (v1 or mode in (None, "null")) else mode,
        on_swap_full="abort",
        **{k: sc[k] for k in ("long_prefill_token_threshold", "scheduler_reserve_full_isl",
                               "watermark", "max_num_active_seqs") if k in sc and v1})
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
    """The plan's kind per row, as `batches.kind` names it (replay.raw.BATCH_KINDS)."""
    from replay.raw import BATCH_KINDS
    if plan.kind is None:
        return ["prefill" if p else "decode" for p in plan.is_prefill.tolist()]
    return [BATCH_KINDS[k] for k in plan.kind.tolist()]


def drive(make_scheduler, sc: dict, engine: str) -> list[dict]:
    """Run the scenario; `make_scheduler(spec, state, keys)` builds the scheduler under test."""
    spec, state, ids, keys = build(sc, engine)
    sched = make_scheduler(spec, state, keys)
    reqs = sc["requests"]
    last_arrival = max(int(r["arrival_step"]) for r in reqs)
    cum = 0
    out: list[dict] = []
    name = lambda rows: [ids[r] for r in rows]  # noqa: E731
    for step in range(1, int(sc.get("max_steps", 200)) + 1):
        for row, r in enumerate(reqs):
            if int(r["arrival_step"]) == step:
                sched.add_request(row)
        for row, r in enumerate(reqs):
            if r.get("abort_step") is not None and int(r["abort_step"]) == step:
                sched.abort_request(row)
        was_preempted = {r for r in range(state.n) if state.status[r] == Status.WAITING
                         and state.num_preemptions[r] > 0}
        was_waiting = {r for r in range(state.n) if state.status[r] == Status.WAITING}
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
        res = sched.update(plan)
        end = sched.snapshot()
        line["finished"] = name(res.finished.tolist())
        line["free_gpu_end"] = end["free_gpu"]
        line["free_cpu_end"] = end["free_cpu"]
        if engine == "v1":
            line["kv_usage"] = round(end["kv_usage"], 4)
        out.append(line)
        if step >= last_arrival and not sched.has_unfinished():
            break
    return out


COMPARED_V0 = ("scheduled", "num_batched_tokens", "preempted", "preempted_metric", "swap_out",
               "swap_in", "ignored", "waiting", "running", "swapped", "free_gpu", "free_cpu",
               "blocks", "finished", "free_gpu_end", "free_cpu_end", "cum_preemptions")
COMPARED_V1 = ("scheduled", "num_batched_tokens", "preempted", "waiting", "running", "free_gpu",
               "computed", "blocks", "finished", "free_gpu_end", "kv_usage")
COMPARED_ABORT = ("abort_victim", "waiting", "running", "swapped", "free_gpu", "free_cpu")


def compare(got: list[dict], want: list[dict], engine: str) -> list[str]:
    """Differences as readable strings (empty when equal)."""
    diffs = []
    if len(got) != len(want):
        diffs.append(f"steps: got {len(got)}, want {len(want)}")
    for g, w in zip(got, want):
        keys = COMPARED_ABORT if "abort" in w else (COMPARED_V0 if engine == "v0" else COMPARED_V1)
        for k in keys:
            if k in w and g.get(k) != w[k]:
                diffs.append(f"step {w['step']} {k}: got {g.get(k)!r}, want {w[k]!r}")
    return diffs
