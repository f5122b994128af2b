"""Generate random V0 scenarios and run them through real vLLM (oracle.run_v0) in-process."""
import contextlib, io, json, random, sys
sys.path.insert(0, "/work/shared/oracle")
import oracle
oracle._quiet()

def scenario(rng):
    bs = rng.choice([2, 4])
    chunked = rng.random() < 0.5
    caching = rng.random() < 0.5
    mode = rng.choice([None, "recompute", "swap"])
    policy = "priority" if (rng.random() < 0.3 and mode != "swap") else "fcfs"
    max_len = rng.choice([16, 24, 32])
    budget = rng.choice([max_len, max_len + 8, 64]) if not chunked else rng.choice([4, 8, 12, 32])
    G = rng.randint(3, 12)
    C = rng.randint(1, 10)
    seqs = rng.randint(1, 4)
    shared = [rng.randint(0, 3) for _ in range(8)]
    reqs = []
    for i in range(rng.randint(1, 6)):
        p = rng.randint(1, max_len - 1)
        r = {"id": f"r{i}", "arrival_step": rng.randint(1, 6), "output_tokens": rng.randint(1, 10),
             "priority": rng.randint(0, 2) if policy == "priority" else 0}
        if caching and rng.random() < 0.7:
            # shared prefixes from a tiny alphabet of blocks
            toks = []
            while len(toks) < p:
                toks += [100 + rng.choice(shared) * 10 + j for j in range(bs)]
            r["prompt_token_ids"] = toks[:p]
        else:
            r["prompt_tokens"] = p
        if rng.random() < 0.1:
            r["abort_step"] = rng.randint(2, 10)
        reqs.append(r)
    reqs.sort(key=lambda r: r["arrival_step"])
    return {"block_size": bs, "num_gpu_blocks": G, "num_cpu_blocks": C, "max_num_seqs": seqs,
            "max_num_batched_tokens": budget, "max_model_len": max_len, "chunked_prefill": chunked,
            "prefix_caching": caching, "policy": policy, "preemption_mode": mode,
            "max_steps": 80, "requests": reqs}

seed0, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(out, "w") as f:
    for s in range(seed0, seed0 + n):
        sc = scenario(random.Random(s))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                oracle.run_v0(sc, sc["max_steps"])
            except Exception as e:
                print(json.dumps({"step": 0, "config_error": f"{type(e).__name__}: {e}"}))
        lines = [json.loads(l) for l in buf.getvalue().splitlines() if l.strip()]
        f.write(json.dumps({"seed": s, "scenario": sc, "expected": lines}) + "\n")
