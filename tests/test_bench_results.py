"""`vllm bench serve --save-result --save-detailed` output as a trace and as client timings (issue 17,
item 3). Fixtures: tests/data/logs/bench_v0.json (the result object, keys of vllm/benchmarks/serve.py)
and, from it, bench_requests.jsonl (per-request RequestFuncOutput rows) and bench_append.jsonl
(`--append-result`, two runs); see make_bench_variants.py."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from capacity.evidence.clientparse import parse_client_file
from capacity.evidence.logs import detect_kind
from traces.loaders import load_trace, load_trace_with_report
from traces.schema import SCHEMA, TraceError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "logs"
BENCH, ROWS, APPEND = DATA / "bench_v0.json", DATA / "bench_requests.jsonl", DATA / "bench_append.jsonl"
KVCAP = str(Path(sys.executable).with_name("kvcap"))
RUN = json.loads(BENCH.read_text())


def test_result_json_is_a_trace_of_its_successful_requests():
    trace, rep = load_trace_with_report(BENCH)
    assert (rep.format, rep.rows_read, rep.requests, rep.failed_requests) == ("vllm_bench", 12, 11, 1)
    failed = [i for i, e in enumerate(RUN["errors"]) if e]
    assert failed == [8] and 8 not in trace["request_id"].to_list()
    ok = [i for i in range(12) if i not in failed]
    starts = np.array(RUN["start_times"])[ok]
    assert trace["arrival_s"].to_numpy() == pytest.approx(starts - starts.min())
    assert trace["prompt_tokens"].to_list() == [RUN["input_lens"][i] for i in ok]
    assert trace["output_tokens"].to_list() == [RUN["output_lens"][i] for i in ok]
    assert dict(trace.schema) == SCHEMA


def test_per_request_jsonl_gives_the_same_trace():
    a = load_trace(BENCH)
    b, rep = load_trace_with_report(ROWS)
    assert (rep.format, rep.failed_requests) == ("vllm_bench_requests", 1)
    assert b.select("arrival_s", "prompt_tokens", "output_tokens").equals(
        a.select("arrival_s", "prompt_tokens", "output_tokens"))


def test_append_result_runs_follow_each_other():
    t, rep = load_trace_with_report(APPEND)
    assert (rep.requests, rep.failed_requests) == (22, 2)
    second = t.filter(pl.col("request_id") >= 12)
    assert second["request_id"].min() == 12
    first = t.filter(pl.col("request_id") < 12)
    assert second["arrival_s"].to_numpy() == pytest.approx(first["arrival_s"].to_numpy() + 300.0)


@pytest.mark.parametrize("drop,needle", [("start_times", "no 'start_times'"),
                                         ("input_lens", "--save-detailed")])
def test_result_without_what_a_replay_needs_is_one_line(tmp_path, drop, needle):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({k: v for k, v in RUN.items() if k != drop}))
    with pytest.raises(TraceError, match=needle) as e:
        load_trace(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_bad_value_names_key_and_request(tmp_path):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(dict(RUN, input_lens=[*RUN["input_lens"][:3], -5, *RUN["input_lens"][4:]])))
    with pytest.raises(TraceError, match=r"key 'input_lens', request 3"):
        load_trace(f)


def test_bench_json_replays_as_a_trace(tmp_path):
    db = tmp_path / "r.duckdb"
    res = subprocess.run([KVCAP, "replay", str(BENCH), "--db", str(db), "--json"], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["requests"], out["requests_finished"], out["status"]) == (11, 11, "completed")
    assert db.exists()


def test_client_timings_from_rows_and_append_match_the_result_json():
    full = parse_client_file(BENCH)
    rows = parse_client_file(ROWS)
    assert detect_kind(ROWS) == "client" and detect_kind(APPEND) == "client"
    # the same tokens; per-request rows carry no date, so no wall clock
    assert rows.select("request_id", "token_index", "ttft_s", "itl_s").equals(
        full.select("request_id", "token_index", "ttft_s", "itl_s"))
    assert rows["send_time"].null_count() == rows.height
    both = parse_client_file(APPEND)
    assert both["request_id"].n_unique() == 22 and "12" in set(both["request_id"])
    late = both.filter(pl.col("request_id") == "12")["send_epoch_s"][0]
    early = both.filter(pl.col("request_id") == "0")["send_epoch_s"][0]
    assert late - early == pytest.approx(300.0)     # each run anchored by its own date


def test_one_reader_serves_trace_client_timings_and_calibration():
    """traces.vllm_bench reads the file for all three consumers: the per-request rows give the
    calibration the same requests as the result JSON, and an --append-result file is refused
    there in one line (a fit is of one run)."""
    from replay.calibration.bench_fit import read_bench
    a, b = read_bench(BENCH), read_bench(ROWS)
    for k in ("arrival_s", "prompt_len", "output_len", "ttft_s"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert np.allclose(a.tpot_s, b.tpot_s, equal_nan=True)
    assert len(a.output_len) == load_trace(BENCH).height == 11
    with pytest.raises(ValueError, match="holds 2 runs"):
        read_bench(APPEND)
