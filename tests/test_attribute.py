"""`kvcap attribute` (issue 8): client TBT spikes lined up with logged preemptions, end to end from
the fixtures in tests/data/logs (the scenario is described in make_fixtures.py)."""
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from capacity.evidence.attribute import NOT_PREEMPTION, attribute
from capacity.evidence.logs import ingest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "logs"
KVCAP = str(Path(sys.executable).with_name("kvcap"))


def kvcap(*args):
    return subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "ev.duckdb"
    ingest([DATA / n for n in ("v0_server.log", "bench_v0.json", "v1_010_server.log",
                               "v1_014_server.log", "client_generic.csv", "client_generic.jsonl")], path)
    return path


def test_every_bench_spike_gets_its_verdict_mode_and_evidence(db):
    a = attribute(db, client="bench_v0.json")
    assert a.spikes == 5 and a.untimed_spikes == 0
    assert a.threshold_s == pytest.approx(5 * 0.0516, abs=0.01)        # 5 x median ITL
    got = {r["request_id"]: (r["verdict"], r["mode"], r["evidence"]) for r in a.table.iter_rows(named=True)}
    assert got == {
        "2": (NOT_PREEMPTION, None, None),                                 # 12:00:22, nothing preempted yet
        "4": ("preemption", "swap", "stats: Swapped > 0"),                 # 12:00:41-43, 3-6 swapped
        "5": ("preemption", "swap", "warning line"),                       # next to warning #51
        "7": ("likely preemption", "recompute", "V0 counter between warnings"),
        "10": (NOT_PREEMPTION, None, None),                                # after the last warning, none swapped
    }
    assert a.verdicts == {"preemption": 2, "likely preemption": 1, NOT_PREEMPTION: 2,
                          "no server log at this time": 0}
    assert a.modes == {"swap": 2, "recompute": 1}


def test_attribution_table_is_stored(db):
    attribute(db, threshold_s=1.0)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT client_source, count(*) FROM attribution GROUP BY 1 ORDER BY 1").fetchall()
    cols = {r[0] for r in con.execute("DESCRIBE attribution").fetchall()}
    con.close()
    # bench: 5 spikes; CSV: req-1's 1.8 s gap; JSONL: j1's 2 s gap
    assert rows == [("bench_v0.json", 5), ("client_generic.csv", 1), ("client_generic.jsonl", 1)]
    assert {"request_id", "token_index", "itl_s", "gap_start_s", "gap_end_s", "spike_time", "verdict",
            "mode", "evidence", "threshold_s", "window_s", "warnings", "max_swapped"} <= cols


def test_generic_clients_and_server_filter(db):
    a = attribute(db, threshold_s=1.0, client="client_generic.jsonl", server="v0_server.log")
    assert a.table.select("verdict", "mode").rows() == [("preemption", "swap")]   # 12:00:41-43
    a = attribute(db, threshold_s=1.0, client="client_generic.csv", server="v1_014_server.log")
    assert a.table["verdict"].to_list() == ["no server log at this time"]        # another day


def test_threshold_and_window(db):
    assert attribute(db, threshold_s=3.0).spikes == 0
    narrow = attribute(db, client="bench_v0.json", window_s=0.0)
    assert narrow.table.filter(pl.col("request_id") == "5")["evidence"][0] == "warning line"


def test_untimed_client_results_are_counted_not_matched(tmp_path):
    db = tmp_path / "ev.duckdb"
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"ttfts": [0.1], "itls": [[0.05, 0.05, 3.0, 0.05]],
                               "input_lens": [10], "output_lens": [5]}))
    ingest([DATA / "v0_server.log", old], db, year=2025)
    a = attribute(db, threshold_s=1.0)
    assert (a.spikes, a.untimed_spikes, a.table.height) == (1, 1, 0)


def test_chart_and_report_section(db):
    from capacity.report.sections import attribution_section
    from capacity.views.evidence import attribution_chart, spikes_for_chart
    a = attribute(db, client="bench_v0.json")
    spec = attribution_chart(a).to_dict()
    assert spec["layer"][0]["mark"]["type"] == "point"
    sec = attribution_section(a)
    assert sec.title.startswith("Production evidence") and len(sec.charts) == 1
    assert "not preemption" in sec.body and "5 client ITL samples" in sec.body
    many = pl.DataFrame({"spike_time": pl.datetime_range(pl.datetime(2025, 1, 1), pl.datetime(2025, 1, 1, 3),
                                                         "500ms", eager=True)}).with_columns(
        itl_s=pl.lit(1.0), verdict=pl.lit("preemption"), mode=pl.lit("swap"))
    assert many.height > 5000 and spikes_for_chart(many).height <= 5000


def test_cli_attribute_json_and_errors(db, tmp_path):
    res = kvcap("attribute", "--db", db, "--json", "--client", "bench_v0.json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"threshold_s", "window_s", "itl_samples", "spikes", "verdicts", "modes", "table", "rows"} <= out.keys()
    assert out["spikes"] == len(out["rows"]) == 5
    assert kvcap("attribute", "--db", db).returncode == 0
    only_logs = tmp_path / "logs.duckdb"
    ingest([DATA / "v0_server.log"], only_logs, year=2025)
    for args, msg in ((("attribute", "--db", only_logs), "no client ITL samples"),
                      (("attribute", "--db", tmp_path / "none.duckdb"), "no such database"),
                      (("attribute", "--db", db, "--window-s", "-1"), "--window-s")):
        bad = kvcap(*args)
        assert bad.returncode == 2 and msg in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
