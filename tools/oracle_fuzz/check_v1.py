"""Replay gen_v1.py's scenarios on both kvcap implementations (the reference V1Scheduler and the
compiled StepCore) the way tests/oracle_driver.py drives them, and report, per implementation,
how many match real vLLM and where the others first differ.

    .venv/bin/python tools/oracle_fuzz/check_v1.py BATCH.jsonl [--show N] [--impl reference|compiled]
        [--seeds 3,17] [--json]

Skipped (counted apart): config errors, runs where vLLM raised, and runs that reached max_steps
(real vLLM hangs on a request that can never fit; kvcap rejects it instead). Scenarios with client
aborts run on both implementations.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from replay.engine.compiled import StepCore  # noqa: E402
from replay.engine.v1 import V1Scheduler  # noqa: E402
from tests.oracle_driver import chunks_by_content, compare, drive  # noqa: E402

IMPLEMENTATIONS = {"reference": V1Scheduler,
                   "compiled": lambda spec, state, keys: StepCore("v1", spec, state, keys)}


def skip_reason(d: dict) -> str | None:
    want = d["expected"]
    if not want or "config_error" in want[0]:
        return "config_error"
    if "abort" in want[-1]:
        return "vllm_raised"
    if len(want) >= d["scenario"]["max_steps"]:
        return "vllm_hangs"
    return None


def tags(sc: dict) -> str:
    off = sc.get("kv_offloading")
    sched = ["async" if sc.get("async_scheduling") else "sync",
             "pc" if sc.get("prefix_caching", True) else "nopc"]
    if any(r.get("abort_step") is not None for r in sc["requests"]):
        sched.append("abort")
    if off is None:     # a batch generated without offloading (gen_v1.py --no-offloading)
        return ",".join(["off"] + sched)
    return ",".join([off.get("eviction_policy", "lru"),
                     "prompt" if off.get("offload_prompt_only", True) else "full",
                     f"T{off.get('transfer_steps', 1)}"] + sched)


def check(d: dict, impl: str) -> list[str]:
    try:
        got = drive(IMPLEMENTATIONS[impl], d["scenario"], "v1")
        canon = chunks_by_content(d["scenario"])
        return compare([canon(x) for x in got], [canon(x) for x in d["expected"]], "v1")
    except Exception as e:  # a crash is a difference too
        return [f"EXC {e!r} {traceback.format_exc()[-400:]}"]


def field_of(diff: str) -> str:
    parts = diff.split()
    return parts[2].rstrip(":") if parts[0] == "step" else parts[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("batch", nargs="+")
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--impl", choices=sorted(IMPLEMENTATIONS), action="append")
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    impls = a.impl or ["reference", "compiled"]
    seeds = None if a.seeds is None else {int(s) for s in a.seeds.split(",")}
    skipped: Counter = Counter()
    report = {i: {"checked": 0, "match": 0, "with_aborts": 0, "first_field": Counter(),
                  "tags": Counter(), "bad_seeds": []} for i in impls}
    for path in a.batch:
        for line in open(path):
            d = json.loads(line)
            if seeds is not None and d["seed"] not in seeds:
                continue
            why = skip_reason(d)
            if why:
                skipped[why] += 1
                continue
            aborts = any(r.get("abort_step") is not None for r in d["scenario"]["requests"])
            for impl in impls:
                r = report[impl]
                r["checked"] += 1
                diffs = check(d, impl)
                if not diffs:
                    r["match"] += 1
                    r["with_aborts"] += aborts
                    continue
                r["first_field"][field_of(diffs[0])] += 1
                r["tags"][tags(d["scenario"])] += 1
                r["bad_seeds"].append(d["seed"])
                if len(r["bad_seeds"]) <= a.show:
                    print(f"[{impl}] seed {d['seed']} ({tags(d['scenario'])}):", *diffs[:4],
                          sep="\n    ")
    out = {"skipped": dict(skipped)}
    for impl, r in report.items():
        out[impl] = {"checked": r["checked"], "match": r["match"],
                     "match_with_aborts": r["with_aborts"],
                     "differ": r["checked"] - r["match"],
                     "first_field": dict(r["first_field"].most_common()),
                     "tags": dict(r["tags"].most_common()), "bad_seeds": r["bad_seeds"]}
    if a.json:
        print(json.dumps(out))
    else:
        print("skipped", out["skipped"])
        for impl in impls:
            o = out[impl]
            print(f"{impl}: {o['match']}/{o['checked']} match ({o['match_with_aborts']} of them "
                  "with client aborts); first differing field "
                  f"{o['first_field']}; by knobs {o['tags']}; seeds {o['bad_seeds'][:40]}")


if __name__ == "__main__":
    main()
