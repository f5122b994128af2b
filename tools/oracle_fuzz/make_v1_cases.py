"""Write the V1 offloading regression cases (tests/data/oracle_v1/NAME.jsonl) from gen_v1.py
seeds, their expected lines produced by real vLLM 0.33 now:

    $ORACLE_HOME/v1/bin/python tools/oracle_fuzz/make_v1_cases.py

Each file: one header line {"name", "seed", "rule", "about", "scenario"}, then the oracle's lines.
The seeds are the smallest scenarios of tools/oracle_fuzz batches whose match with real vLLM breaks
when the reference drops the rule (tests/test_v1_offload_regressions.py runs them).
"""
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_v1  # noqa: E402  (re-executes with PYTHONHASHSEED=0 first)

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "oracle_v1"
CASES = {
    "R1_async_placeholders_have_no_keys": (1272, "R1", "Async, prompt-only off: a decode's store stops at the request's real tokens (a placeholder has no block hash, so no offload key)."),
    "R2_failed_store_ranks_lru": (164, "R2", "LRU: a store that does not fit still records the request's access (it takes its request rank, raises its chunks' ranks) before the fit check."),
    "R2_failed_store_adapts_arc": (1378, "R2", "ARC: a failed store's ghost hits still move target_t1 (on_store_miss runs before the fit check, once per request)."),
    "R3_lru_rank_only_raised": (1145, "R3", "LRU: a request's first sighting of a chunk raises its rank to (request rank, -position) only if that is higher; a later sighting changes nothing."),
    "R3_pending_chunks_not_recorded": (1405, "R3", "A chunk offered while another request's store of it is in flight is neither stored nor recorded (it is not a ready reuse), so the request's finish does not promote it."),
    "R4_fence_only_finished_stores": (156, "R4", "A request's own admission (its whole block table counts as handed out) does not flush its store in flight: only finished requests' stores fence their blocks."),
    "R4_gpu_hit_blocks_count_as_allocated": (1307, "R4", "A finished request's store in flight is flushed when another request takes one of its blocks as a GPU prefix hit (update_state_after_alloc gets the whole table)."),
    "C1_load_admission_reserves_prefill_blocks": (1113, "C1", "A CPU-hit (async load) admission must fit beside the blocks the in-flight prefills still need; vLLM never gives a loaded request's blocks back."),
    "C2_whole_prompt_cpu_hit_counted": (1149, "C2", "A CPU hit that reaches the whole prompt counts every prompt token as vLLM's external hit, although the last one is recomputed (F5)."),
    "C4_abort_in_flight_frees_after_step": (1021, "C4", "Async with the connector: an aborted request whose step is in flight gives its blocks back when that step's output is processed."),
    "C4_no_rejection_while_frees_deferred": (161, "C4", "While an aborted request's blocks wait for its in-flight step, a head that does not fit waits too (kvcap's never-fits rejection must not fire)."),
    "N1_async_cache_only_real_tokens": (1575, "N1", "Async: a block is registered in the GPU prefix cache at schedule time only up to the real tokens (a placeholder's block is not hit)."),
    "N1_async_cache_on_output": (1468, "N1", "Async: when a step's output is applied, the request's blocks are cached up to its processed tokens (update_from_output cache_blocks)."),
    "N4_waiting_for_kv_until_the_loop_sees_it": (24, "N4", "A request stays WAITING_FOR_REMOTE_KVS after its load is done until the waiting loop reaches it (a step that preempts never does)."),
    "N3_skipped_loading_request_stays_first": (1522, "N3", "Priority: a request whose load is in flight is skipped for the step and put back in front of kv_holding_waiting, which the waiting view lists before the waiting queue."),
    "N5_long_prefill_cap_counts_loading_requests": (7503, "N5", "--knobs: the long-prefill cap applies when running + waiting + kv_holding_waiting (loading) requests are more than one."),
    "N6_priority_kv_holding_waiting_by_priority": (20049, "N6", "--aborts 0.4: under the priority policy kv_holding_waiting is a priority queue too: a later, higher-priority loading request is listed (and drained) before an earlier, lower-priority one."),
}
# Cases drawn with gen_v1.py --knobs (more scheduler knobs).
KNOBS = {"N5_long_prefill_cap_counts_loading_requests"}
# Cases drawn with gen_v1.py --aborts P (the abort probability per request).
ABORTS = {"N6_priority_kv_holding_waiting_by_priority": 0.4}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (seed, rule, about) in CASES.items():
        sc = gen_v1.scenario(random.Random(seed), name in KNOBS, abort_p=ABORTS.get(name, 0.07))
        lines = gen_v1.run(sc)
        head = {"name": name, "seed": seed, "knobs": name in KNOBS, "rule": rule, "about": about,
                "scenario": sc}
        with open(OUT / f"{name}.jsonl", "w") as f:
            for x in [head] + lines:
                f.write(json.dumps(x, separators=(",", ":")) + "\n")
        print(name, len(lines), "lines")


if __name__ == "__main__":
    main()
