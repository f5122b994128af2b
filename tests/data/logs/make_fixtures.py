"""Writes the log fixtures of this folder (run once; the outputs are committed).

    .venv/bin/python tests/data/logs/make_fixtures.py

Every stats line uses the exact format strings of reference D2, every preemption warning comes from
`replay.engine.v0.logline.preemption_warning` (reference A5, 1 in 50 logged). Line shapes (prefixes, pids,
noise) follow lines users posted in vLLM issues (#3094, #6737, #12314; intel/llm-scaler#391).

Scenario (all times local, no year in the V0/V1-0.10 logs: 2025 is meant):
- v0_server.log, 2025-05-20 12:00-12:02, vLLM 0.6.3 (V0), stats every 5 s. 110 preemptions between
  12:00:37 and 12:01:40; warnings logged for #1 (swap, 12:00:37), #51 (swap, 12:00:52) and #101
  (recompute, 12:01:31). Requests swapped out 12:00:40-12:00:55 (peak 6).
- bench_v0.json: `vllm bench serve --save-result --save-detailed` against that server, 12 requests
  sent every 10 s from 12:00:00; ITL spikes at ~12:00:22 (no preemption yet), ~12:00:41 (swapped
  interval), ~12:00:51 (next to warning #51), ~12:01:12 (between warnings: derived only),
  ~12:01:42 (after the last warning, nothing swapped: not preemption). One failed request.
- v1_010_server.log, 2025-05-21 09:00, V1 0.10, two engines (DP=2), stats every 10 s.
- v1_014_server.log, 2025-05-22 14:00 server time (12:00 UTC), V1 >= 0.14 with `Preemptions: P`,
  each line prefixed by kubectl's ISO timestamp (UTC, nanoseconds).
- client_generic.csv / client_generic.jsonl: the generic client formats (wide and long).
"""
from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from replay.engine.v0.logline import preemption_warning  # noqa: E402

V0_STATS = ("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, "
            "CPU KV cache usage: %.1f%%.")
V0_PREFIX = "Prefix cache hit rate: GPU: %.2f%%, CPU: %.2f%%"
V1_STATS = ("Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
            "tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache "
            "hit rate: %.1f%%")
GREEN, RESET, YELLOW = "\x1b[32m", "\x1b[0m", "\x1b[33m"
T0 = datetime(2025, 5, 20, 12, 0, 0)


def v0_prefix(level: str, t: datetime, where: str) -> str:
    return f"{level} {t:%m-%d %H:%M:%S} {where}] "


def v0_log() -> str:
    out = [
        v0_prefix("INFO", T0 - timedelta(seconds=14), "api_server.py:528") + "vLLM API server version 0.6.3.post1",
        v0_prefix("INFO", T0 - timedelta(seconds=9), "distributed_gpu_executor.py:57") + "# GPU blocks: 2048, # CPU blocks: 512",
        "INFO:     Started server process [4711]",
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
    ]
    # (seconds after T0) -> running, swapped, pending, gpu %, cpu %, prompt tps, gen tps
    series = {5: (4, 0, 0, 10.2, 0.0, 812.4, 96.0), 10: (6, 0, 0, 21.7, 0.0, 420.0, 240.3),
              15: (8, 0, 0, 33.0, 0.0, 388.1, 310.9), 20: (11, 0, 0, 47.5, 0.0, 610.2, 402.2),
              25: (14, 0, 0, 58.9, 0.0, 598.7, 488.0), 30: (17, 0, 0, 71.3, 0.0, 702.5, 560.4),
              35: (20, 0, 1, 85.6, 0.0, 655.0, 633.1), 40: (24, 3, 4, 99.4, 8.2, 501.3, 588.6),
              45: (24, 5, 6, 99.8, 13.7, 120.4, 612.0), 50: (23, 6, 7, 99.9, 16.4, 98.2, 597.5),
              55: (24, 2, 5, 99.1, 5.5, 240.6, 620.8), 60: (22, 0, 3, 97.0, 0.0, 310.2, 640.3),
              65: (22, 0, 2, 97.8, 0.0, 280.4, 655.1), 70: (21, 0, 3, 98.2, 0.0, 301.9, 641.7),
              75: (22, 0, 2, 97.5, 0.0, 268.0, 650.2), 80: (22, 0, 2, 98.0, 0.0, 290.3, 648.8),
              85: (21, 0, 1, 96.4, 0.0, 233.3, 630.0), 90: (21, 0, 1, 96.9, 0.0, 250.7, 628.4),
              95: (19, 0, 0, 88.2, 0.0, 120.5, 590.1), 100: (16, 0, 0, 74.0, 0.0, 96.1, 512.6),
              105: (13, 0, 0, 61.8, 0.0, 102.3, 441.5), 110: (9, 0, 0, 45.1, 0.0, 0.0, 333.0),
              115: (5, 0, 0, 24.6, 0.0, 0.0, 190.2), 120: (0, 0, 0, 0.0, 0.0, 0.0, 12.4)}
    events: list[tuple[float, str]] = []
    for s in range(0, 120, 10):
        t = T0 + timedelta(seconds=s, milliseconds=3)
        events.append((s + 0.003, v0_prefix("INFO", t, "logger.py:37") +
                       f"Received request cmpl-{s:04d}a1b2: prompt: None, params: SamplingParams(n=1, "
                       "temperature=0.0, max_tokens=150, ignore_eos=True), prompt_token_ids: [128000, 791, 4062], "
                       "lora_request: None, prompt_adapter_request: None."))
        events.append((s + 0.004, v0_prefix("INFO", t, "engine.py:290") + f"Added request cmpl-{s:04d}a1b2."))
        events.append((s + 0.005, 'INFO:     10.0.0.7:5%04d - "POST /v1/completions HTTP/1.1" 200 OK' % s))
    for s, (run, swp, pend, gpu, cpu, ptps, gtps) in series.items():
        t = T0 + timedelta(seconds=s)
        level = "DEBUG" if run == 0 else "INFO"
        line = v0_prefix(level, t, "metrics.py:351") + V0_STATS % (ptps, gtps, run, swp, pend, gpu, cpu)
        if s in (25, 45):                       # coloured console output captured to a file
            line = line.replace(f"{level} ", f"{GREEN}{level}{RESET} ", 1)
        if s == 100:
            line += "   "                       # trailing spaces, as in issue #1935
        events.append((s, line))
        if s % 20 == 0 or s == 5:               # --enable-prefix-caching: second line
            events.append((s + 0.0001, v0_prefix(level, t, "metrics.py:367") + V0_PREFIX % (42.15 + s / 10, 0.0)))
    # 110 preemptions: #1-#50 in 37..52 s (swap), #51-#100 in 52..91 s (#51 swap, the rest
    # recompute), #101-#110 in 91..100 s (recompute). Only #1, #51, #101 are logged.
    times = np.r_[np.linspace(37, 51.9, 50), np.linspace(52, 90.9, 50), np.linspace(91, 100, 10)]
    for k, ts in enumerate(times, 1):
        mode = "swap" if k <= 51 else "recompute"
        msg = preemption_warning(str(7 + k), mode, k)
        if msg is None:
            continue
        t = T0 + timedelta(seconds=float(ts))
        line = v0_prefix("WARNING", t, "scheduler.py:1481") + msg
        if k == 51:
            line = f"{YELLOW}WARNING{RESET} " + line[len("WARNING "):]
        events.append((float(ts), line))
    # A client disconnect mid-stream: ERROR line plus a multi-line traceback without prefixes.
    tb = [v0_prefix("ERROR", T0 + timedelta(seconds=72), "serving_completion.py:345") +
          "Error in completion stream generator.",
          "Traceback (most recent call last):",
          '  File "/usr/local/lib/python3.10/dist-packages/vllm/entrypoints/openai/serving_completion.py", line 260, in completion_stream_generator',
          "    async for prompt_idx, res in result_generator:",
          '  File "/usr/local/lib/python3.10/dist-packages/vllm/utils.py", line 506, in merge_async_iterators',
          "    item = await d",
          "asyncio.exceptions.CancelledError"]
    events.append((72.5, "\n".join(tb)))
    # A stats line cut short (log rotation / a killed writer): must be reported, not fatal.
    events.append((107.5, v0_prefix("INFO", T0 + timedelta(seconds=107), "metrics.py:351") +
                   "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 401.7 tokens/s, "
                   "Running: 11 reqs, Swapped: 0 reqs, Pend"))
    events.append((108.0, v0_prefix("DEBUG", T0 + timedelta(seconds=108), "client.py:154") + "Heartbeat successful."))
    events.sort(key=lambda e: e[0])
    return "\n".join(out + [e[1] for e in events]) + "\n"


def bench_json() -> dict:
    """`vllm bench serve --save-result --save-detailed` output (vllm/benchmarks/serve.py keys)."""
    rng = np.random.default_rng(8)
    n_out, base_itl = 150, 0.05
    spikes = {2: [(20, 1.9)], 4: [(20, 2.5)], 5: [(10, 2.0)], 7: [(30, 2.2)], 10: [(40, 2.4)]}
    start0 = 5123.456789                        # time.perf_counter() of the first send
    ttfts, itls, starts, ins, outs, errs, lats, texts = [], [], [], [], [], [], [], []
    for i in range(12):
        starts.append(start0 + 10.0 * i + 0.001 * i)
        if i == 8:                              # a failed request: no tokens, error text
            ttfts.append(0.0), itls.append([]), ins.append(512), outs.append(0)
            errs.append("ClientConnectorError: Server disconnected"), lats.append(0.0), texts.append("")
            continue
        itl = list(np.round(base_itl + rng.uniform(-0.008, 0.012, n_out - 1), 6))
        for idx, val in spikes.get(i, []):
            itl[idx] = val
        ttft = round(float(0.14 + rng.uniform(0, 0.05)), 6)
        ttfts.append(ttft), itls.append([float(x) for x in itl]), ins.append(int(480 + 8 * i))
        outs.append(n_out), errs.append(""), lats.append(round(ttft + float(sum(itl)), 6))
        texts.append(" the")
    duration = 120.0
    return {"date": "20250520-120200", "endpoint_type": "vllm", "backend": "vllm",
            "label": None, "model_id": "meta-llama/Llama-3.1-8B-Instruct",
            "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 12,
            "request_rate": 0.1, "burstiness": 1.0, "max_concurrency": None,
            "duration": duration, "completed": 11, "failed": 1,
            "total_input_tokens": sum(ins), "total_output_tokens": sum(outs),
            "request_throughput": 11 / duration, "request_goodput": None,
            "output_throughput": sum(outs) / duration,
            "total_token_throughput": (sum(ins) + sum(outs)) / duration,
            "input_lens": ins, "output_lens": outs, "ttfts": ttfts, "itls": itls,
            "latencies": lats, "start_times": starts, "generated_texts": texts, "errors": errs,
            "max_output_tokens_per_s": 620.0, "max_concurrent_requests": 2,
            "mean_ttft_ms": 160.2, "median_ttft_ms": 158.9, "p99_ttft_ms": 188.0}


def v1_010_log() -> str:
    t0 = datetime(2025, 5, 21, 9, 0, 0)
    pre = lambda t, f: f"(APIServer pid=851) INFO {t:%m-%d %H:%M:%S} [{f}] "  # noqa: E731
    lines = [pre(t0 - timedelta(seconds=30), "api_server.py:1880") + "vLLM API server version 0.10.1.1",
             f"(EngineCore_DP0 pid=901) INFO {t0 - timedelta(seconds=20):%m-%d %H:%M:%S} [kv_cache_utils.py:833] GPU KV cache size: 452,112 tokens"]
    run = [[12, 30, 48, 60, 64, 64, 64, 58, 40, 22, 6, 0], [10, 28, 50, 61, 64, 64, 63, 55, 37, 20, 5, 0]]
    wait = [[0, 0, 4, 20, 43, 33, 23, 10, 0, 0, 0, 0], [0, 0, 2, 18, 40, 30, 21, 8, 0, 0, 0, 0]]
    for k in range(12):
        t = t0 + timedelta(seconds=10 * (k + 1))
        for e in (0, 1):
            kv = min(99.0, 1.6 * run[e][k] + 0.3 * k)
            lines.append(pre(t, "loggers.py:123") + V1_STATS % (
                e, 1200.0 * (k < 8) + 3.5 * k, 40.0 * run[e][k] / 2, run[e][k], wait[e][k], kv, 31.0 + k))
        lines.append(f'(APIServer pid=851) INFO:     10.109.20.86:59146 - "GET /metrics HTTP/1.1" 200 OK')
        if k == 6:
            lines += [f"(APIServer pid=851) ERROR {t:%m-%d %H:%M:%S} [serving_chat.py:1107] Error in chat completion stream generator.",
                      "(APIServer pid=851) Traceback (most recent call last):",
                      '(APIServer pid=851)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/serving_chat.py", line 597, in chat_completion_stream_generator',
                      "(APIServer pid=851)     async for res in result_generator:",
                      "(APIServer pid=851) asyncio.exceptions.CancelledError"]
    return "\n".join(lines) + "\n"


def v1_014_log() -> str:
    t0 = datetime(2025, 5, 22, 14, 0, 0)
    parts = [  # (running, waiting, extras before GPU, gpu %, extras after)
        (32, 0, "", 61.0, ", Prefix cache hit rate: 35.2%"),
        (64, 12, ", Preemptions: 7", 99.1, ", Prefix cache hit rate: 35.0%"),
        (64, 25, ", Deferred: 3 reqs, Preemptions: 19", 99.6, ", Prefix cache hit rate: 34.1%, External prefix cache hit rate: 12.0%"),
        (62, 9, ", Preemptions: 2", 98.7, ", Prefix cache hit rate: 34.4%"),
        (40, 0, "", 72.3, ", Prefix cache hit rate: 36.0%, MM cache hit rate: 0.0%"),
        (12, 0, "", 20.4, ""),
    ]
    lines = []
    for k, (r, w, mid, gpu, tail) in enumerate(parts):
        t = t0 + timedelta(seconds=10 * (k + 1))
        # kubectl logs --timestamps: UTC with nanoseconds; the server's own clock is UTC+2.
        iso = (t - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S") + f".{123456789 + k:09d}Z"
        body = (f"Engine 000: Avg prompt throughput: {2400.0 - 300 * k:.1f} tokens/s, Avg generation "
                f"throughput: {30.0 * r:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs{mid}, "
                f"GPU KV cache usage: {gpu:.1f}%{tail}")
        lines.append(f"{iso} (APIServer pid=77) INFO {t:%m-%d %H:%M:%S} [loggers.py:248] {body}")
        lines.append(f'{iso} (APIServer pid=77) INFO:     10.1.0.4:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    return "\n".join(lines) + "\n"


def generic_clients() -> tuple[str, str]:
    base = datetime(2025, 5, 20, 12, 0, 0, tzinfo=timezone.utc).timestamp()   # Unix seconds, like time.time()
    rows = ["request_id,send_time,token_times,prompt_tokens,output_tokens"]
    for r, (sent, gaps) in enumerate([(0.0, [0.2, 0.05, 0.05, 0.05]), (1.5, [0.3, 0.05, 1.8, 0.05]),
                                      (3.0, [0.25, 0.06, 0.05, 0.04])]):
        tt = np.cumsum([base + sent, *gaps])[1:]
        rows.append(f'req-{r},{base + sent:.6f},"{";".join(f"{x:.6f}" for x in tt)}",100,{len(gaps)}')
    jl = []
    send = datetime(2025, 5, 20, 12, 0, 40)
    for r in range(2):
        s = send + timedelta(seconds=r)
        t = s + timedelta(seconds=0.2)
        for i in range(4):
            jl.append(json.dumps({"request_id": f"j{r}", "send_time": s.isoformat(timespec="milliseconds"),
                                  "token_time": t.isoformat(timespec="milliseconds")}))
            t += timedelta(seconds=2.0 if (r, i) == (1, 1) else 0.05)
    return "\n".join(rows) + "\n", "\n".join(jl) + "\n"


def main() -> None:
    (HERE / "v0_server.log").write_text(v0_log())
    (HERE / "bench_v0.json").write_text(json.dumps(bench_json()))
    (HERE / "v1_010_server.log").write_text(v1_010_log())
    (HERE / "v1_014_server.log").write_text(v1_014_log())
    csv, jsonl = generic_clients()
    (HERE / "client_generic.csv").write_text(csv)
    (HERE / "client_generic.jsonl").write_text(jsonl)


if __name__ == "__main__":
    main()
