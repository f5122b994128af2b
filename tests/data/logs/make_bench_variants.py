"""Writes the other two shapes of `vllm bench serve` output from bench_v0.json (run once; committed).

    .venv/bin/python tests/data/logs/make_bench_variants.py

- bench_requests.jsonl: one object per request with the fields of vLLM's `RequestFuncOutput`
  (vllm/benchmarks/lib/endpoint_request_func.py): generated_text, success, latency, output_tokens,
  ttft, itl, tpot, prompt_len, error, start_time.
- bench_append.jsonl: what `--append-result` leaves after two runs, one result object per line; the
  second run starts 300 s after the first (its perf_counter start times and its `date` move on).
"""
import json
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
run = json.loads((HERE / "bench_v0.json").read_text())
rows = []
for i, (p, o, ttft, itl, err, s) in enumerate(zip(run["input_lens"], run["output_lens"], run["ttfts"],
                                                  run["itls"], run["errors"], run["start_times"])):
    ok = not err
    rows.append({"generated_text": "", "success": ok, "latency": (ttft + sum(itl)) if ok else 0.0,
                 "output_tokens": o, "ttft": ttft, "itl": itl,
                 "tpot": (sum(itl) / (o - 1)) if ok and o > 1 else 0.0,
                 "prompt_len": p, "error": err, "start_time": s})
(HERE / "bench_requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
second = dict(run, start_times=[s + 300.0 for s in run["start_times"]],
              date=(datetime.strptime(run["date"], "%Y%m%d-%H%M%S") + timedelta(seconds=300)).strftime("%Y%m%d-%H%M%S"))
(HERE / "bench_append.jsonl").write_text(json.dumps(run) + "\n" + json.dumps(second) + "\n")
