"""Issue 34: random mutations of every evidence format `kvcap logs` reads (server logs V0 / V1,
Prometheus text, query_range JSON, a vllm bench result, client CSV) are accepted with sane values
or refused in one clean line, never a traceback, a hang, a half-written database or accepted
nonsense. A slice of the benchmark (bench/bench_fuzz.py: 1,000 per format, its table in
docs/reliability.md); KVCAP_EVIDENCE_FUZZ raises the count per format.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.evidence_mutations import SEEDS, check, long_run

PER_FORMAT = int(os.environ.get("KVCAP_EVIDENCE_FUZZ", "30"))


@pytest.mark.parametrize("name", list(SEEDS))
def test_unmutated_seed_is_accepted(name):
    """The seeds are valid (else the fuzzing would only ever see refusals)."""
    suffix, data, _ = SEEDS[name]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"seed{suffix}"
        path.write_bytes(data)
        assert check(name, path, Path(d)) == "accepted"


@pytest.mark.parametrize("name", list(SEEDS))
def test_mutations_are_accepted_or_refused_in_one_line(name):
    s = long_run(PER_FORMAT, seed=34, timeout_s=60, formats=[name])[name]
    assert s["traceback"] == s["hang"] == s["nonsense"] == 0, s
    assert s["accepted"] + s["error"] == PER_FORMAT


@pytest.mark.parametrize("table, row", [
    ("client_tokens", {"source_file": "c.csv", "request_id": "r0", "send_epoch_s": 10.0, "token_index": 0,
                       "rel_s": -1.0, "token_epoch_s": 9.0, "ttft_s": -1.0}),
    ("prom_samples", {"source_file": "s.prom", "server": "s", "metric": "vllm:x_total", "type": "counter",
                      "labels": "{}", "epoch_s": 10.0, "value": -3.0}),
    ("prom_windows", {"source_file": "s.prom", "server": "s", "metric": "vllm:x_total", "type": "counter",
                      "labels": "{}", "stat": "rate_per_s", "value": -0.5}),
])
def test_the_checker_calls_accepted_nonsense_nonsense(tmp_path, table, row):
    """Were a parser to store a negative TTFT, counter or rate, the fuzzing would count it."""
    import duckdb

    from capacity.evidence.logs import ensure_evidence_schema
    from tests.evidence_mutations import Nonsense, check_invariants
    db = tmp_path / "k.duckdb"
    with duckdb.connect(str(db)) as con:
        ensure_evidence_schema(con, db)
        con.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                    list(row.values()))
    with pytest.raises(Nonsense, match=table):
        check_invariants(db)
