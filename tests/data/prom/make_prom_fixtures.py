"""Writes the Prometheus fixtures of this folder (run once; the outputs are committed).

    .venv/bin/python tests/data/prom/make_prom_fixtures.py

The exposition text is produced by `prometheus_client` itself from metrics declared with vLLM 0.33's
names, types, labels (`model_name`, `engine`) and buckets (vllm/v1/metrics/loggers.py):
- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1);
- counters `vllm:num_preemptions`, `vllm:prompt_tokens`, `vllm:generation_tokens`,
  `vllm:prefix_cache_queries`, `vllm:prefix_cache_hits` (exposed with `_total`, plus `_created`);
- histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
  `vllm:e2e_request_latency_seconds` with vLLM's buckets, and the per-request
  `vllm:request_num_preemptions` (0.33; its buckets here are 0, 1, 2, 5, 10, 20, 50: an assumption,
  the tests only read its count).

Scenario: 2025-05-20 12:00:00-12:02:00 UTC (the day of ../logs/v0_server.log), a scrape every 10 s.
- scrapes/server-a/<unix seconds>.prom: one server with two engines (DP=2), 13 scrapes.
- server-b.prom: another server, one engine, 13 scrapes concatenated, each after a `# <unix seconds>`
  line; the process restarts before the 8th scrape (its counters start again from 0).
- query_range.json: a Prometheus `query_range` export (step 10 s) of both servers
  (`instance` 10.0.0.1:8000 and 10.0.0.2:8000) for running, KV usage, preemptions and TTFT buckets.
- scenario.json: the ground truth: per server, engine and 10 s interval, what was added to each
  counter, the gauges at the scrape ending it, and the TTFT observations.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HERE = Path(__file__).resolve().parent
T0 = 1747742400          # 2025-05-20 12:00:00 UTC
STEP_S, SCRAPES = 10, 13
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0]
PREEMPT_BUCKETS = [0, 1, 2, 5, 10, 20, 50]
# The TTFT observations of server-a engine 0 in the 4th interval (12:00:30-12:00:40): 4 in
# (0.04, 0.06], 6 in (0.06, 0.08] -> p50 = 0.06 + 0.02 * (5 - 4) / 6 (tests/test_prom.py).
KNOWN_TTFT = [0.05, 0.05, 0.05, 0.05, 0.07, 0.07, 0.07, 0.07, 0.07, 0.07]


class Server:
    def __init__(self, engines: list[str]):
        self.reg = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.g = {n: Gauge(n, d, lab, registry=self.reg) for n, d in (
            ("vllm:num_requests_running", "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."))}
        self.c = {n: Counter(n, d, lab, registry=self.reg) for n, d in (
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
            ("vllm:prompt_tokens", "Number of prefill tokens processed."),
            ("vllm:generation_tokens", "Number of generation tokens processed."),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."))}
        self.h = {n: Histogram(n, d, lab, buckets=b, registry=self.reg) for n, d, b in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS),
            ("vllm:request_num_preemptions", "Number of preemptions per finished request.", PREEMPT_BUCKETS))}
        for e in engines:           # vLLM creates every labelled child at start: all series from scrape 1
            for m in (*self.g.values(), *self.c.values(), *self.h.values()):
                m.labels(MODEL, e)

    def text(self) -> str:
        return generate_latest(self.reg).decode()


def interval(rng, server: str, engine: str, k: int) -> dict:
    """What happens in interval k (ends at scrape k): a load that peaks mid-run."""
    load = float(np.sin(np.pi * k / (SCRAPES - 1)))
    pre = int(rng.poisson(6 * load ** 4)) if k else 0
    ttft = KNOWN_TTFT if (server, engine, k) == ("server-a", "0", 4) else \
        [float(x) for x in np.round(rng.lognormal(np.log(0.05 + 0.4 * load), 0.3, size=rng.integers(3, 9)), 4)]
    return {"preemptions": pre, "prompt_tokens": int(4000 * load) + 100 * k,
            "generation_tokens": int(900 * load) + 10 * k,
            "prefix_cache_queries": int(4000 * load), "prefix_cache_hits": int(1500 * load),
            "running": int(4 + 28 * load), "waiting": int(max(0.0, 30 * load - 12)),
            "kv_cache_usage_perc": round(0.1 + 0.88 * load, 4), "ttft": ttft,
            "itl": [float(x) for x in np.round(rng.gamma(4, 0.006 + 0.02 * load ** 2, size=20), 4)],
            "e2e": [float(x) for x in np.round(rng.lognormal(np.log(2 + 20 * load), 0.4, size=4), 3)],
            "req_preemptions": [int(x) for x in rng.poisson(load * 2, size=4)]}


def apply(srv: Server, engine: str, ev: dict) -> None:
    for name in ("preemptions", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits"):
        metric = "vllm:num_preemptions" if name == "preemptions" else f"vllm:{name}"
        srv.c[metric].labels(MODEL, engine).inc(ev[name])
    srv.g["vllm:num_requests_running"].labels(MODEL, engine).set(ev["running"])
    srv.g["vllm:num_requests_waiting"].labels(MODEL, engine).set(ev["waiting"])
    srv.g["vllm:kv_cache_usage_perc"].labels(MODEL, engine).set(ev["kv_cache_usage_perc"])
    for key, metric in (("ttft", "vllm:time_to_first_token_seconds"), ("itl", "vllm:inter_token_latency_seconds"),
                        ("e2e", "vllm:e2e_request_latency_seconds"), ("req_preemptions", "vllm:request_num_preemptions")):
        for x in ev[key]:
            srv.h[metric].labels(MODEL, engine).observe(x)


def main() -> None:
    rng = np.random.default_rng(17)
    truth: dict = {"t0": T0, "step_s": STEP_S, "scrapes": SCRAPES, "restart_before_scrape": {"server-b": 7},
                   "intervals": {}}
    folder = HERE / "scrapes" / "server-a"
    shutil.rmtree(HERE / "scrapes", ignore_errors=True)
    folder.mkdir(parents=True)
    a, b = Server(["0", "1"]), Server(["0"])
    b_text = []
    series: dict[tuple, list] = {}
    for k in range(SCRAPES):
        t = T0 + k * STEP_S
        for name, srv, engines in (("server-a", a, ["0", "1"]), ("server-b", b, ["0"])):
            if name == "server-b" and k == truth["restart_before_scrape"]["server-b"]:
                srv = b = Server(["0"])
            for e in engines:
                ev = interval(rng, name, e, k)
                apply(srv, e, ev)
                truth["intervals"][f"{name}/{e}/{k}"] = ev
        (folder / f"{t}.prom").write_text(a.text())
        b_text.append(f"# {t}\n{b.text()}")
        for inst, srv in (("10.0.0.1:8000", a), ("10.0.0.2:8000", b)):
            for fam in srv.reg.collect():
                for s in fam.samples:
                    if s.name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                                  "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_bucket"):
                        key = (s.name, inst, tuple(sorted(s.labels.items())))
                        series.setdefault(key, []).append([t, repr(float(s.value))])
    (HERE / "server-b.prom").write_text("".join(b_text))
    result = [{"metric": {"__name__": n, "instance": inst, "job": "vllm", **dict(lab)}, "values": v}
              for (n, inst, lab), v in sorted(series.items())]
    (HERE / "query_range.json").write_text(json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}))
    (HERE / "scenario.json").write_text(json.dumps(truth, indent=1))


if __name__ == "__main__":
    main()
