"""Generate random small V1 scenarios with CPU KV offloading on and run them through real vLLM
0.33 (the oracle's run_v1, in-process), one JSON object per line: {"seed", "scenario", "expected"}.

    $ORACLE_HOME/v1/bin/python tools/oracle_fuzz/gen_v1.py SEED0 COUNT OUT.jsonl [--knobs] [--big]
        [--no-offloading] [--aborts P]

Knobs drawn per scenario: LRU or ARC, offload_prompt_only on/off, sync or async scheduling,
transfer_steps 1 or 2, GPU prefix caching on/off, chunked prefill on/off, FCFS or priority,
tight GPU pools (preemption), small CPU tiers (eviction and failed stores), prompts built from a
small alphabet of blocks (shared prefixes), repeated prompts and next-turn prompts (an earlier
prompt plus its output plus more), occasional aborts; with --knobs also the full-ISL gate off, the
long-prefill cap, the watermark and max_num_active_seqs; with --big up to 8 requests, 64-token
contexts, 8-token blocks and pools up to 23 blocks. --no-offloading drops `kv_offloading` from
each scenario (the same draws otherwise: the V1 scheduler alone); --aborts P gives each request a
client abort with probability P (default 0.07).

Request ids are chosen so that Python's set of request ids iterates them in trace order under
PYTHONHASHSEED=0 (the oracle's seed): real vLLM processes same-step finishes in the iteration
order of a set (oracle README F13); kvcap uses trace order, so ids whose hash slots follow trace
order make the two agree without changing anything in vLLM.
"""
import contextlib
import io
import json
import os
import random
import sys

if os.environ.get("PYTHONHASHSEED") != "0":      # the oracle's pinned seed (README F13)
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

sys.path.insert(0, "/work/shared/oracle")
import oracle  # noqa: E402

oracle._quiet()
MAX_REQUESTS = 8


def _ordered_ids(n):
    """n ids r0.. whose str hashes (seed 0) sit in slots 0..n-1 of a 32-slot table, hence of an
    8-slot one too: a set of up to 18 of them iterates in trace order."""
    out = []
    for i in range(n):
        k = 0
        while hash(f"r{i}_{k}") & 31 != i:
            k += 1
        out.append(f"r{i}_{k}")
    return out


IDS = _ordered_ids(MAX_REQUESTS)
assert list({*IDS[:4]}) == IDS[:4] and list({*IDS}) == IDS


def scenario(rng, knobs=False, big=False, abort_p=0.07):
    bs = rng.choice([2, 4, 8] if big else [2, 4])
    max_len = rng.choice([32, 48, 64] if big else [16, 24, 32])
    chunked = rng.random() < 0.8
    budget = (rng.choice([4, 8, 12, 16, 32]) if chunked else
              rng.choice([max_len, 64, 96] if big else [max_len, 32, 64]))
    G = rng.randint(6, 24) if big else rng.randint(4, 14)    # incl. the null block
    C = rng.randint(1, 12)
    policy = "priority" if rng.random() < 0.2 else "fcfs"
    sc = {"block_size": bs, "num_gpu_blocks": G, "max_num_seqs": rng.randint(1, 4),
          "max_num_batched_tokens": budget, "max_model_len": max_len,
          "chunked_prefill": chunked, "prefix_caching": rng.random() < 0.75, "policy": policy,
          "async_scheduling": rng.random() < 0.5, "max_steps": 200 if big else 100}
    off = {"num_cpu_blocks": C}
    if rng.random() < 0.5:
        off["eviction_policy"] = rng.choice(["lru", "arc"])
    if rng.random() < 0.4:
        off["offload_prompt_only"] = False
    if rng.random() < 0.25:
        off["transfer_steps"] = 2
    sc["kv_offloading"] = off
    alphabet = [[1000 + a * 100 + j for j in range(bs)] for a in range(rng.randint(2, 5))]
    reqs, prompts = [], []
    n = rng.randint(1, MAX_REQUESTS if big else 7)
    arrivals = sorted(rng.randint(1, 20 if big else 10) for _ in range(n))
    # Most KV slots a request may need: the GPU pool (a request that can never fit hangs
    # real vLLM; kvcap rejects it instead).
    cap = min((G - 1) * bs, max_len - 1)
    for i in range(n):
        kind = rng.random()
        p = rng.randint(1, max(1, cap - 1))
        if prompts and kind < 0.25:                 # a repeated prompt
            toks = list(rng.choice(prompts))
        elif prompts and kind < 0.4:                # a next turn: prompt + its output + more
            j = rng.randrange(len(prompts))
            toks = prompts[j] + [oracle.out_token(j, k) for k in range(reqs[j]["output_tokens"])]
            toks += [5000 + i * 100 + k for k in range(rng.randint(1, 6))]
        elif kind < 0.75:                           # blocks from a small alphabet
            toks = []
            while len(toks) < p:
                toks += rng.choice(alphabet)
            toks = toks[:p]
        else:                                       # unique tokens
            toks = [(i + 1) * 100_000 + k for k in range(p)]
        toks = toks[: max(1, cap - 1)]
        out = rng.randint(1, max(1, min(20 if big else 10, cap + 1 - len(toks))))
        r = {"id": IDS[i], "arrival_step": arrivals[i], "prompt_token_ids": toks,
             "output_tokens": out}
        if policy == "priority":
            r["priority"] = rng.randint(0, 2)
        if rng.random() < abort_p:
            r["abort_step"] = rng.randint(arrivals[i], arrivals[i] + 8)
        prompts.append(toks)
        reqs.append(r)
    sc["requests"] = reqs
    if knobs:   # more V1 scheduler knobs, drawn last so the base scenario of a seed stays put
        if rng.random() < 0.5:
            sc["scheduler_reserve_full_isl"] = False
        if rng.random() < 0.3:
            sc["long_prefill_token_threshold"] = rng.choice([2, 4, 8])
        if rng.random() < 0.3:
            sc["watermark"] = rng.choice([0.05, 0.1, 0.2])
        if rng.random() < 0.2:
            sc["max_num_active_seqs"] = rng.randint(1, sc["max_num_seqs"])
    return sc


def run(sc):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            oracle.run_v1(sc, sc["max_steps"])
        except Exception as e:   # SchedulerConfig validation and the like
            print(json.dumps({"step": 0, "config_error": f"{type(e).__name__}: {e}"}))
    return [json.loads(x) for x in buf.getvalue().splitlines() if x.strip()]


def main():
    seed0, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    opts = sys.argv[4:]
    knobs, big = "--knobs" in opts, "--big" in opts
    abort_p = float(opts[opts.index("--aborts") + 1]) if "--aborts" in opts else 0.07
    with open(out, "w") as f:
        for s in range(seed0, seed0 + n):
            sc = scenario(random.Random(s), knobs, big, abort_p)
            if "--no-offloading" in opts:
                del sc["kv_offloading"]
            f.write(json.dumps({"seed": s, "scenario": sc, "expected": run(sc)}) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
