import json, sys, traceback
sys.path.insert(0, "/work/main")
from tests.oracle_driver import drive, compare
from tests.test_v0_oracle import VllmChunkView
from replay.engine.v0 import V0Scheduler
bad = 0; total = 0; kinds = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    want = d["expected"]
    if want and "config_error" in want[0]:
        continue
    if want and ("AssertionError" in want[-1].get("abort", "") or "config_error" in want[-1]):
        continue
    total += 1
    try:
        got = drive(lambda s, st, k: VllmChunkView(V0Scheduler(s, st, k)), d["scenario"], "v0")
        diffs = compare(got, want, "v0")
    except Exception as e:
        diffs = ["EXC " + repr(e) + traceback.format_exc()[-600:]]
    if diffs and len(want) == d["scenario"]["max_steps"] and "abort" not in want[-1]:
        kinds["vllm_livelock"] = kinds.get("vllm_livelock", 0) + 1
        continue
    if diffs:
        bad += 1
        sc = d["scenario"]
        tag = (sc["chunked_prefill"], sc["prefix_caching"], sc["preemption_mode"], sc["policy"])
        kinds[tag] = kinds.get(tag, 0) + 1
        if len(want) == d["scenario"]["max_steps"] and "abort" not in want[-1]:
            kinds["vllm_livelock"] = kinds.get("vllm_livelock", 0) + 1
            continue
        if bad <= int(sys.argv[2]) if len(sys.argv) > 2 else 3:
            print("seed", d["seed"], tag, diffs[:4])
print("total", total, "bad", bad, kinds)
