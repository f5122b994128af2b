"""`kvcap calibrate --from-logs LOG --trace TRACE` (replay/calibration/log_fit.py, issue 18 item 4): a vLLM V1
server log synthesised from a replay of a known trace with a known `kernel_scale` (stats lines
every 10 s computed as vLLM's logger does: prompt tokens in the interval of each request's first
token, generated tokens, running at the line) is fitted back to that scale, the trace is placed
at the right offset on the log's clock, and the written profile makes the replay run the logged
number of requests; logs it cannot fit are refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from replay.calibration.bench_fit import replay_state
from replay.config import EngineConfig, resolve
from replay.engine.prefix import UniqueBlockKeys
from replay.engine.state import RequestState
from replay.timing import step_profile
from traces.loaders import write_trace
from traces.schema import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
KVCAP = Path(sys.executable).with_name("kvcap")
SHIPPED = step_profile.PROFILE_DIR / "h100--llama-3.1-8b--bf16--tp1.json"
TRUE_SCALE, OFFSET_S, INTERVAL_S = 1.15, 37.3, 10.0
# The V1 logger's line (vllm/v1/metrics/loggers.py), as tests/data/logs/make_fixtures.py writes it.
V1_STATS = ("Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
            "tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache "
            "hit rate: %.1f%%")
T0 = datetime(2026, 12, 2)


def _server(tmp: Path, n=1200, rate=4.0, seed=1) -> tuple[Path, Path]:
    """(log, trace): the trace and the log of a server whose steps are TRUE_SCALE x the profile."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    arrival = np.sort((arrival - arrival[0]) * (1 + 0.5 * np.sin(arrival / 40)))  # a varying load
    prompt, output = rng.integers(100, 3000, n), rng.integers(2, 600, n)
    tables = replace(step_profile.load(SHIPPED), kernel_scale=TRUE_SCALE)
    cfg = EngineConfig(model="llama-3.1-8b", gpu="h100")
    raw, _ = replay_state(RequestState(arrival_s=arrival, prompt_len=prompt, output_len=output),
                          UniqueBlockKeys(), cfg, tables)
    st = raw.steps
    end = st["start_s"] + st["duration_s"]
    total = resolve(cfg).spec.num_gpu_blocks - 1
    first = raw.first_token_s
    lines = []
    for k in range(1, int((end[-1] + OFFSET_S) / INTERVAL_S) + 2):
        hi = k * INTERVAL_S - OFFSET_S                  # trace time at the line
        m = (end > hi - INTERVAL_S) & (end <= hi)
        f = (first > hi - INTERVAL_S) & (first <= hi)
        last = max(int(np.searchsorted(end, hi, side="right")) - 1, 0)
        t = T0 + timedelta(seconds=k * INTERVAL_S)
        lines.append(f"INFO {t:%m-%d %H:%M:%S} [loggers.py:123] " + V1_STATS % (
            0, prompt[f].sum() / INTERVAL_S, (st["num_decode_tokens"][m].sum() + f.sum()) / INTERVAL_S,
            st["num_running"][last], st["num_waiting"][last],
            100 * st["gpu_blocks_used"][last] / total, 0.0))
    log = tmp / "server.log"
    log.write_text("\n".join(lines) + "\n")
    trace = pl.DataFrame({"request_id": np.arange(n), "arrival_s": arrival, "prompt_tokens": prompt,
                          "output_tokens": output, "priority": np.zeros(n, np.int32),
                          "tenant": [None] * n, "prefix_hashes": [None] * n}, schema=SCHEMA)
    path = tmp / "trace.parquet"
    write_trace(trace, path)
    return log, path


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(KVCAP), "calibrate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("logs")
    log, trace = _server(d)
    out = d / "cal.json"
    res = _calibrate("--from-logs", str(log), "--trace", str(trace), "--gpu", "h100", "-o",
                     str(out), "--json")
    assert res.returncode == 0, res.stderr
    return log, trace, out, json.loads(res.stdout)


def test_fit_recovers_the_scale_and_the_offset(fitted):
    _, _, out, summary = fitted
    assert summary["written"] and summary["base"] == "h100--llama-3.1-8b--bf16--tp1"
    assert summary["constants"]["kernel_scale"] == pytest.approx(TRUE_SCALE, rel=0.02)
    # the log's clock is 2000-12-02 (the fit reads it with any year); the trace starts OFFSET_S in
    epoch0 = (datetime(2000, 12, 2) - datetime(1970, 1, 1)).total_seconds()
    assert summary["fit"]["offset_s"] - epoch0 == pytest.approx(OFFSET_S, abs=1.0)
    # the shipped profile (scale 1) ran clearly fewer requests at once than the server did
    assert summary["fit"]["running_sum_error_pct_shipped"] > 10
    prof = json.loads(out.read_text())
    assert prof["calibration"]["from_logs"].endswith("server.log")
    assert prof["name"].endswith("--calibrated")


def test_the_profile_reproduces_the_logged_running_requests(fitted):
    """Through `--calibration` (the path users take), the replay runs the logged number of
    requests at the logged instants: within 5 % summed over the lines with requests running."""
    log, trace, out, summary = fitted
    from capacity.evidence.logparse import parse_server_log
    from replay.timing.executors import cost_model_for
    from replay.calibration.log_fit import running_at
    from replay.run import request_state
    from traces.loaders import load_trace
    cfg = EngineConfig(model="llama-3.1-8b", gpu="h100", calibration=str(out))
    cm = cost_model_for(resolve(cfg), calibration=cfg.calibration)
    raw, _ = replay_state(request_state(load_trace(trace)), UniqueBlockKeys(), cfg, cm.measured)
    st = parse_server_log(log.read_text().splitlines(), "s.log", 2000).stats
    st = st.filter(pl.col("running") >= 1)
    got = running_at(raw, st["epoch_s"].to_numpy() - summary["fit"]["offset_s"])
    assert got.sum() == pytest.approx(st["running"].sum(), rel=0.05)


def test_a_log_that_does_not_fit_is_refused(fitted, tmp_path):
    log, trace, _, _ = fitted
    # A 10x busier server than any scale can make this trace: nothing written, exit 1.
    busy = tmp_path / "busy.log"
    busy.write_text("".join(line.replace("Running: ", "Running: 9") + "\n"
                            for line in log.read_text().splitlines()))
    out = tmp_path / "never.json"
    res = _calibrate("--from-logs", str(busy), "--trace", str(trace), "--gpu", "h100", "-o", str(out))
    assert res.returncode == 1 and not out.exists()
    assert "no profile written" in res.stderr


@pytest.mark.parametrize("args,msg", [
    ([], "give --trace"),
    (["--trace", "{trace}", "--from-bench", "{log}"], "give one of them"),
])
def test_missing_or_conflicting_inputs_are_one_line(fitted, args, msg, tmp_path):
    log, trace, _, _ = fitted
    args = [a.format(trace=trace, log=log) for a in args]
    res = _calibrate("--from-logs", str(log), *args, "-o", str(tmp_path / "x.json"))
    assert res.returncode == 2 and msg in res.stderr and len(res.stderr.strip().splitlines()) == 1
