"""Valid small evidence files of every format `kvcap logs` reads, and random mutations of them run
through the CLI in-process (issue 34: "1,000 mutations per evidence format").

Formats: vLLM server logs of the V0 and V1 eras, a Prometheus text scrape file (two scrapes with
time lines), a Prometheus `query_range` export, a `vllm bench serve` result (JSON) and generic
client timings (CSV). The mutations are the project's own (tests/trace_mutations.py: line
endings, BOM, padded / extra / missing fields, stray quotes, dropped or repeated lines, odd
values, byte flips), with payloads that evidence files add (a logger prefix, a process tag, a
negative or NaN counter, a `# TYPE` or time line, an `le` bound).

`check(name, path, tmp)` runs each command of the format on one file and classifies it:
'accepted' (exit 0, and the stored rows hold no value vLLM could not have produced: INVARIANTS),
'error' (exit 2, one line `kvcap: error: ...` on stderr, the new --db not left behind); anything
else raises `Escape` (a traceback, a multi-line or silent failure, a half-written database) or
`Nonsense` (accepted nonsense). `long_run(n)` counts outcomes per format, with a per-case
timeout (SIGALRM: a hang is counted apart). Shared by bench/bench_fuzz.py (the 1,000-mutation table in
docs/reliability.md) and tests/test_reliability_evidence_fuzz.py (a slice).
"""
from __future__ import annotations

import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.trace_mutations import OPS, PAYLOADS, mutate

V0_LOG = """\
INFO 05-20 11:59:46 api_server.py:528] vLLM API server version 0.6.3.post1
INFO 05-20 11:59:51 distributed_gpu_executor.py:57] # GPU blocks: 2048, # CPU blocks: 512
INFO:     10.0.0.7:50000 - "POST /v1/completions HTTP/1.1" 200 OK
INFO 05-20 12:00:05 metrics.py:351] Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 96.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 10.2%, CPU KV cache usage: 0.0%.
INFO 05-20 12:00:05 metrics.py:367] Prefix cache hit rate: GPU: 42.65%, CPU: 0.00%
WARNING 05-20 12:00:07 scheduler.py:1089] Sequence group cmpl-0007 is preempted by PreemptionMode.SWAP mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=1
INFO 05-20 12:00:10 metrics.py:351] Avg prompt throughput: 420.0 tokens/s, Avg generation throughput: 240.3 tokens/s, Running: 6 reqs, Swapped: 2 reqs, Pending: 1 reqs, GPU KV cache usage: 99.7%, CPU KV cache usage: 3.1%.
WARNING 05-20 12:00:12 scheduler.py:1089] Sequence group cmpl-0011 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. total_num_cumulative_preemption=51
INFO 05-20 12:00:15 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 310.0 tokens/s, Running: 5 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 71.0%, CPU KV cache usage: 0.0%.
ERROR 05-20 12:00:16 async_llm_engine.py:63] RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error.
"""
V1_LOG = """\
(APIServer pid=377) INFO 11-20 09:59:30 [api_server.py:1880] vLLM API server version 0.33.0
(EngineCore pid=412) INFO 11-20 10:00:01 [gpu_worker.py:340] Available KV cache memory: 12.40 GiB
(EngineCore pid=412) INFO 11-20 10:00:01 [kv_cache_utils.py:1290] GPU KV cache size: 101,584 tokens
(EngineCore pid=412) INFO 11-20 10:00:01 [kv_cache_utils.py:1295] Maximum concurrency for 8,192 tokens per request: 12.40x
(APIServer pid=377) INFO 11-20 10:00:10 [loggers.py:236] Engine 000: Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 96.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 10.2%, Prefix cache hit rate: 42.6%
(APIServer pid=377) INFO:     10.109.20.86:59146 - "GET /metrics HTTP/1.1" 200 OK
(APIServer pid=377) INFO 11-20 10:00:20 [loggers.py:236] Engine 000: Avg prompt throughput: 1620.0 tokens/s, Avg generation throughput: 410.5 tokens/s, Running: 31 reqs, Waiting: 12 reqs, Deferred: 3 reqs, Preemptions: 7, GPU KV cache usage: 99.1%, Prefix cache hit rate: 38.0%
(APIServer pid=377) INFO 11-20 10:00:30 [loggers.py:236] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 455.0 tokens/s, Running: 28 reqs, Waiting: 5 reqs, Preemptions: 2, GPU KV cache usage: 97.4%, Prefix cache hit rate: 38.0%
(EngineCore pid=412) ERROR 11-20 10:00:41 [core.py:912] EngineCore encountered a fatal error.
"""


def _scrape(t: int, running: int, tokens: int, buckets: tuple[int, int, int]) -> str:
    b = "".join(f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}\n'
                for le, c in zip(("1.0", "5.0", "+Inf"), buckets))
    return (f"# {t}\n"
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}.0\n'
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {tokens}.0\n'
            "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.\n"
            "# TYPE vllm:e2e_request_latency_seconds histogram\n" + b +
            f'vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} {buckets[-1]}.0\n'
            f'vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {buckets[-1] * 2}.5\n')


PROM_TEXT = _scrape(1747742400, 3, 1000, (1, 4, 5)) + _scrape(1747742410, 7, 5200, (2, 9, 11))


def _series(name: str, labels: dict, values: list) -> dict:
    return {"metric": {"__name__": name, "instance": "10.0.0.1:8000", "engine": "0", **labels},
            "values": [[1747742400 + 10 * i, str(v)] for i, v in enumerate(values)]}


QUERY_RANGE = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
    _series("vllm:kv_cache_usage_perc", {}, [0.1, 0.33, 0.54]),
    _series("vllm:num_preemptions_total", {}, [0, 4, 9]),
    *[_series("vllm:time_to_first_token_seconds_bucket", {"le": le}, v)
      for le, v in (("0.1", [1, 3, 4]), ("1.0", [2, 6, 9]), ("+Inf", [2, 7, 10]))],
    _series("vllm:time_to_first_token_seconds_count", {}, [2, 7, 10]),
    _series("vllm:time_to_first_token_seconds_sum", {}, [0.3, 1.9, 2.6])]}}) + "\n"

BENCH_JSON = json.dumps({
    "date": "20250520-120200", "backend": "vllm", "model_id": "m", "num_prompts": 4,
    "duration": 12.0, "completed": 3, "failed": 1,
    "input_lens": [480, 488, 496, 504], "output_lens": [3, 4, 0, 3],
    "ttfts": [0.15, 0.16, 0.0, 0.21], "itls": [[0.02, 0.03], [0.02, 0.02, 0.04], [], [0.03, 0.03]],
    "start_times": [100.0, 101.5, 103.0, 104.25],
    "errors": ["", "", "Server disconnected", ""]}) + "\n"

CLIENT_CSV = ("request_id,send_time,token_times,prompt_tokens,output_tokens\n"
              'req-0,1747742400.000000,"1747742400.200000;1747742400.250000;1747742400.300000",100,3\n'
              'req-1,1747742401.500000,"1747742401.800000;1747742401.850000;1747742403.650000",100,3\n'
              'req-2,1747742403.000000,"1747742403.250000;1747742403.310000;1747742403.360000",100,3\n')

# format name -> (file suffix, valid bytes, the commands each mutant goes through)
LOGS = ("logs", "{file}", "--db", "{db}", "--year", "2025", "--json")
SEEDS: dict[str, tuple[str, bytes, tuple[tuple[str, ...], ...]]] = {
    "server-log-v0": (".log", V0_LOG.encode(), (LOGS,)),
    "server-log-v1": (".log", V1_LOG.encode(), (LOGS,)),
    "prometheus-text": (".prom", PROM_TEXT.encode(), (LOGS,)),
    "query-range-json": (".json", QUERY_RANGE.encode(), (LOGS,)),
    "bench-json": (".json", BENCH_JSON.encode(), (LOGS, ("trace", "info", "{file}", "--json"))),
    "client-csv": (".csv", CLIENT_CSV.encode(), (LOGS,)),
}

# What evidence files add to the trace mutators' payloads.
EVIDENCE_PAYLOADS = PAYLOADS + (
    b"INFO 05-20 12:00:05 metrics.py:351] ", b"(APIServer pid=9) ", b"Avg prompt throughput: ",
    b"Running: -1 reqs", b"GPU KV cache usage: 250%", b"total_num_cumulative_preemption=",
    b"# GPU blocks: ", b"Engine 001: ", b"-5", b"1e308", b"-Inf", b"+Inf", b'le="', b"_bucket",
    b"# TYPE x counter\n", b"# TYPE x histogram\n", b"# 1747742405\n", b"# EOF\n", b'"values": ',
    b'"result": {}', b"[[", b"]]", b'"ttfts": ', b"1747742399.9", b"2025-05-20T12:00:00Z")


class Escape(AssertionError):
    """A mutant that was neither accepted nor refused in one clean line."""


class Nonsense(Escape):
    """A mutant accepted with values no vLLM server or client produces (a negative latency,
    count or rate, a KV usage above 100%, buckets that decrease)."""


# What no accepted evidence may hold: (table, SQL condition of a bad row).
INVARIANTS = (
    ("client_tokens", "ttft_s < 0 OR itl_s < 0 OR isnan(ttft_s) OR isnan(itl_s) "
                      "OR token_epoch_s < send_epoch_s"),
    ("prom_samples", "(type = 'counter' OR part IN ('bucket', 'count')) AND (value < 0 OR isnan(value) "
                     "OR isinf(value))"),
    ("prom_windows", "stat IN ('increase', 'rate_per_s', 'count') AND value < 0"),
    ("log_stats", "running < 0 OR waiting < 0 OR gpu_kv_usage < 0 OR gpu_kv_usage > 1 "
                  "OR prompt_throughput_tps < 0 OR generation_throughput_tps < 0"),
    ("log_engine", "num_gpu_blocks < 0 OR kv_cache_tokens < 0"),
)


def check_invariants(db: Path) -> None:
    import duckdb
    with duckdb.connect(str(db), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        for table, bad in INVARIANTS:
            if table in tables:
                row = con.execute(f"SELECT * FROM {table} WHERE {bad} LIMIT 1").fetchone()
                if row is not None:
                    raise Nonsense(f"accepted into {table}: {row!r}"[:300])
        if "prom_samples" in tables:    # cumulative buckets never decrease as le grows
            row = con.execute(
                "SELECT metric, labels, epoch_s FROM (SELECT *, value - lag(value) OVER (PARTITION BY "
                "server, metric, labels, epoch_s ORDER BY le) AS d FROM prom_samples WHERE part = "
                "'bucket') WHERE d < 0 LIMIT 1").fetchone()
            if row is not None:
                raise Nonsense(f"accepted decreasing buckets: {row!r}")


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from capacity.cli import app
    return CliRunner().invoke(app, args)


def check(name: str, path: Path, tmp: Path) -> str:
    """Run the format's commands on `path`: 'accepted' when every one exits 0, else 'error' (a
    clean refusal); raises Escape for anything else."""
    outcome = "accepted"
    for k, cmd in enumerate(SEEDS[name][2]):
        db = tmp / f"k{k}.duckdb"
        args = [a.format(file=path, db=db) for a in cmd]
        res = _invoke(args)
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            exc = res.exception
            raise Escape(f"{' '.join(args[:2])}: {type(exc).__name__}: {str(exc)[:200]}")
        err = [line for line in res.stderr.splitlines() if line.strip()]
        if res.exit_code == 0:
            if cmd[-1] == "--json":
                json.loads(res.stdout)
            if "{db}" in cmd:
                check_invariants(db)
            continue
        if res.exit_code != 2:
            raise Escape(f"{' '.join(args[:2])}: exit {res.exit_code}: {res.stderr[-300:]!r}")
        errors = [line for line in err if line.startswith("kvcap: error:")]
        if len(errors) != 1 or "Traceback" in res.stderr:
            raise Escape(f"{' '.join(args[:2])}: not one error line: {res.stderr[-300:]!r}")
        if "\x1b" in errors[0] or "\x00" in errors[0]:
            raise Escape(f"control characters echoed raw: {errors[0]!r}")
        if db.exists() or Path(str(db) + ".wal").exists():
            raise Escape(f"{' '.join(args[:2])}: refused, but left {db.name} behind")
        outcome = "error"
    return outcome


class _Hang(Exception):
    pass


def _raise_hang(signum, frame):
    raise _Hang


def random_ops(rng: random.Random) -> list[tuple[str, int, bytes]]:
    return [(rng.choice(OPS), rng.randrange(1 << 16), rng.choice(EVIDENCE_PAYLOADS))
            for _ in range(rng.randint(1, 4))]


def long_run(per_format: int, seed: int = 0, *, timeout_s: int = 30, keep: Path | None = None,
             formats: list[str] | None = None, quiet: bool = False) -> dict[str, dict]:
    """`per_format` random mutation sequences of each seed file through its commands: counts of
    accepted / error / traceback / hang and the wall seconds per format. Failing mutants are
    copied to `keep` (when given) and named on stderr."""
    rng = random.Random(seed)
    old = signal.signal(signal.SIGALRM, _raise_hang)
    summary: dict[str, dict] = {}
    try:
        for name in formats or list(SEEDS):
            suffix, data = SEEDS[name][:2]
            counts = {"accepted": 0, "error": 0, "traceback": 0, "hang": 0, "nonsense": 0}
            t0 = time.perf_counter()
            for i in range(per_format):
                ops = random_ops(rng)
                with tempfile.TemporaryDirectory(prefix="kvcap-fuzz-") as d:
                    path = Path(d) / f"{name}-{i}{suffix}"
                    path.write_bytes(mutate(data, ops))
                    signal.alarm(timeout_s)
                    try:
                        counts[check(name, path, Path(d))] += 1
                        failed = None
                    except _Hang:
                        counts["hang"] += 1
                        failed = "hang"
                    except Nonsense as exc:
                        counts["nonsense"] += 1
                        failed = f"Nonsense: {exc}"
                    except Exception as exc:  # noqa: BLE001 - every escape is counted
                        counts["traceback"] += 1
                        failed = f"{type(exc).__name__}: {exc}"
                    finally:
                        signal.alarm(0)
                    if failed:
                        if keep is not None:
                            keep.mkdir(parents=True, exist_ok=True)
                            (keep / path.name).write_bytes(path.read_bytes())
                        if not quiet:
                            print(f"{name} #{i} {ops!r}: {failed[:300]}", file=sys.stderr)
            summary[name] = {**counts, "mutations": per_format, "wall_s": time.perf_counter() - t0}
    finally:
        signal.signal(signal.SIGALRM, old)
    return summary


if __name__ == "__main__":
    print(json.dumps(long_run(int(sys.argv[1]) if len(sys.argv) > 1 else 100), indent=1))
