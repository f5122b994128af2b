"""`kvcap sweep` (capacity/analyses/grid.py, distributed.py): grids, the local pool and a local Ray
cluster giving identical DuckDB tables, resume, retry-then-report, and Ray imported only when
used. One Ray instance for the whole module (2 CPUs), shut down at the end."""
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from capacity.analyses.distributed import RAY_ENV_DIR, make_points, stored_run_ids, sweep
from capacity.analyses.grid import parse_grid_file, parse_grid_text, points
from capacity_helpers import CONV, KVCAP, ROOT
from replay.config import EngineConfig
from replay.results.store import SCHEMA, connect

GRID = "max_num_seqs=8,64;rate_scale=1,3"
VOLATILE = {"runs": ["created_at", "wall_seconds"]}     # when and how long, not what


@pytest.fixture(scope="module")
def tiny():
    from traces.loaders import load_trace
    return {"conv60": load_trace(CONV).head(60)}


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    import ray          # `make venv` installs kvcap[ray]: a missing Ray fails, never skips
    from capacity.analyses.distributed import start_local_ray
    marks = tmp_path_factory.mktemp("marks")
    os.environ["KVCAP_TEST_SWEEP_DIR"] = str(marks)
    start_local_ray(num_cpus=2, paths=(str(Path(__file__).parent), str(ROOT)),
                    env={"KVCAP_TEST_SWEEP_DIR": str(marks)})
    yield ray
    ray.shutdown()


def dump(db) -> dict[str, pl.DataFrame]:
    out = {}
    with connect(db, read_only=True) as con:
        for table in SCHEMA:
            if not con.execute("SELECT count(*) FROM information_schema.tables WHERE "
                               "table_name = ?", [table]).fetchall()[0][0]:
                continue
            df = con.sql(f"SELECT * FROM {table}").pl().drop(VOLATILE.get(table, []))
            out[table] = df.sort(df.columns)
    return out


def grid_points(trace, grid=GRID):
    return make_points(trace, EngineConfig(num_gpu_blocks_override=300), points(parse_grid_text(grid)),
                       default_trace="conv60")


def test_grid_text_and_file(tmp_path):
    g = parse_grid_text("max-num-seqs=64,128; --enable-prefix-caching=true,false;rate_scale=2;"
                        "gpu_memory_utilization=none,0.8")
    assert g == {"max_num_seqs": [64, 128], "enable_prefix_caching": [True, False],
                 "rate_scale": [2.0], "gpu_memory_utilization": [None, 0.8]}
    assert len(points(g)) == 8 and points(g)[1]["gpu_memory_utilization"] == 0.8
    for bad, msg in (("max_num_sequences=4", "unknown grid key"), ("max_num_seqs=a", "not a number"),
                     ("max_num_seqs", "key=value"), ("swap_space=none", "no 'vLLM default'")):
        with pytest.raises(ValueError, match=msg):
            parse_grid_text(bad)
    f = tmp_path / "g.yml"
    f.write_text("grid:\n  max_num_seqs: [8, 16]\n  trace: [a.csv]\n  swap_spaces: [1]\n")
    with pytest.raises(ValueError, match=r"g.yml:4: unknown grid key 'swap_spaces'"):
        parse_grid_file(f)
    f.write_text("grid:\n  max_num_seqs: [8, 16]\n  trace: [a.csv]\n")
    assert parse_grid_file(f)["trace"] == [str(tmp_path / "a.csv")]


def test_ray_is_imported_only_when_used():
    code = ("import sys\nfrom capacity.cli import main\nimport capacity.analyses.distributed\n"
            "sys.argv = ['kvcap', '--help']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "sys.stdout = sys.__stdout__\nprint('RAY' if 'ray' in sys.modules else 'NO-RAY')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip().endswith("NO-RAY"), out.stderr


def test_local_pool_and_ray_write_identical_tables(tiny, tmp_path, ray_cluster):
    pts = grid_points(tiny)
    local = sweep(pts, tiny, db=tmp_path / "local.duckdb", executor="local", workers=2)
    on_ray = sweep(pts, tiny, db=tmp_path / "ray.duckdb", executor="ray")
    assert local.failed == on_ray.failed == []
    assert sorted(local.written) == sorted(on_ray.written) == sorted(p.run_id for p in pts)
    a, b = dump(tmp_path / "local.duckdb"), dump(tmp_path / "ray.duckdb")
    assert a.keys() == b.keys() and a["runs"].height == 4 and a["steps"].height > 0
    for table in a:
        assert a[table].equals(b[table]), table
    # Resume: a rerun replays nothing, every point is already stored.
    again = sweep(pts, tiny, db=tmp_path / "ray.duckdb", executor="ray")
    assert again.written == [] and sorted(again.skipped) == sorted(local.written)


def test_failed_task_is_retried_then_reported(tiny, tmp_path, ray_cluster):
    from sweep_helpers import flaky
    pts = grid_points(tiny, "max_num_seqs=13,64")
    for executor, workers in (("local", 2), ("ray", None)):
        for f in Path(os.environ["KVCAP_TEST_SWEEP_DIR"]).iterdir():
            f.unlink()
        db = tmp_path / f"{executor}.duckdb"
        out = sweep(pts, tiny, db=db, executor=executor, workers=workers, work=flaky, retries=1)
        # max_num_seqs=64 failed once and succeeded on its retry; 13 failed twice: reported.
        assert out.written == [pts[1].run_id], executor
        assert [f["index"] for f in out.failed] == [0], executor
        assert "injected failure of point 0" in out.failed[0]["error"]
        assert stored_run_ids(db) == {pts[1].run_id}


def test_cli_sweep_local_then_ray_auto(tmp_path, ray_cluster):
    """`kvcap sweep` on the local pool, then `--ray-address auto` against the running cluster
    (this module's Ray instance) into another file: the same tables; a rerun skips everything."""
    from traces.loaders import load_trace, write_trace
    src = tmp_path / "t.parquet"
    write_trace(load_trace(CONV).head(60), src)

    def run(db, *extra):
        res = subprocess.run([KVCAP, "sweep", str(src), "--grid", "max_num_seqs=8,64", "--db",
                              str(db), "--num-gpu-blocks-override", "300", "--json", *extra],
                             capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "KVCAP_RAY_ADDRESS": "",
                                  # the driver's own `import ray`: see ray_env/rfc3987_syntax.py
                                  "PYTHONPATH": RAY_ENV_DIR})
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    first = run(tmp_path / "a.duckdb", "--workers", "1")
    assert len(first["runs"]) == 2 and sorted(first["written"]) == sorted(first["runs"])
    assert {s["max_num_seqs"] for s in first["summaries"]} == {8, 64}
    second = run(tmp_path / "b.duckdb", "--ray-address", "auto")
    assert second["executor"] == "ray" and second["runs"] == first["runs"]
    a, b = dump(tmp_path / "a.duckdb"), dump(tmp_path / "b.duckdb")
    assert all(a[t].equals(b[t]) for t in a)
    third = run(tmp_path / "b.duckdb", "--ray-address", "auto")
    assert third["written"] == [] and sorted(third["skipped"]) == sorted(first["runs"])
