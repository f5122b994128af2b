"""The notebooks (issue 9): every one executes headless on a small trace, and all stay thin.

Execution: papermill-style parameter injection (a cell after the `parameters` cell, as papermill
writes it) and nbclient with the venv's `python3` kernel, in a temp dir, in notebook order with one
DuckDB file so that later notebooks find the runs of earlier ones (06 compares its log-based swap
size with the replay-based one 03 stored). Thinness (DESIGN §8, STYLE): no def/class/lambda, no
loops, short cells (the `parameters` cell: literals only, any length), outputs stripped, one
`parameters` cell. The .ipynb files are the only source (no generator): edit them in JupyterLab
and clear their outputs before committing.
"""
import ast
import json
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]-*.ipynb"))
MAX_CELL_LINES = 15
LOGS = ROOT / "tests" / "data" / "logs"

SMALL_FLASH = {"duration_s": 120, "rate_rps": 4.0, "surge_start_s": 40, "ramp_s": 10,
               "hold_s": 30, "decay_s": 20}
# Small-trace parameters per notebook (the defaults are a few times larger).
PARAMS = {
    "01-explore-trace": {},   # trace_path: a small Mooncake file written by the test (prefix reuse)
    "02-replay-and-preemption": {"scenario_params": SMALL_FLASH},
    "03-swap-space-sizing": {"scenario_params": SMALL_FLASH, "sweep_fractions": [0.5],
                             "offload_sizes": [4.0]},
    "04-max-num-seqs": {"scenario_params": SMALL_FLASH, "max_num_seqs_grid": [32, 64]},
    "05-priority-and-fairness": {"scenario_params": {"duration_s": 90, "rate_rps": 3.0,
                                                     "batch_job_interval_s": 30,
                                                     "batch_job_requests": 40}},
    "06-production-evidence": {"log_files": [str(LOGS / "v0_server.log"), str(LOGS / "bench_v0.json")],
                               "prom_files": [str(ROOT / "tests" / "data" / "prom" / "scrapes" / "server-a")],
                               "scenario_params": {"duration_s": 120, "rate_rps": 1.0}},
}


def mooncake_file(path: Path) -> Path:
    """A tiny Mooncake-format trace (ms timestamps, prefix-block hashes) that shares a prefix."""
    rows = [{"timestamp": 250 * i, "input_length": 600 + 7 * i, "output_length": 40 + i,
             "hash_ids": [0, 1, 2 + i % 5]} for i in range(200)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def parameterized(nb_path: Path, params: dict):
    """The notebook with `params` injected after its `parameters` cell (papermill's layout)."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook
    nb = load_notebook_node(str(nb_path))   # adds the per-cell metadata papermill expects
    return parameterize_notebook(nb, params, kernel_name="python3", language="python")


def execute(nb, cwd: Path):
    from nbclient import NotebookClient
    # Generous timeouts: on a loaded 2-core machine a kernel can take long to start.
    NotebookClient(nb, kernel_name="python3", timeout=300, startup_timeout=300,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def errors(nb) -> list[str]:
    return ["".join(o.get("traceback", [])) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def has_chart(nb) -> bool:
    return any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))


def code_cells(path: Path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_the_six_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == list(PARAMS)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Every notebook executed in order in one temp dir (shared DuckDB); name -> (nb, seconds)."""
    work = tmp_path_factory.mktemp("notebooks")
    db = str(work / "kvcap-notebooks.duckdb")
    out = {}
    for path in NOTEBOOKS:
        params = dict(PARAMS[path.stem], db_path=db)
        if path.stem.startswith("01"):
            params["trace_path"] = str(mooncake_file(work / "mooncake.jsonl"))
        t0 = time.perf_counter()
        nb = execute(parameterized(path, params), work)
        out[path.stem] = (nb, time.perf_counter() - t0)
        nbformat.write(nb, work / path.name)
    return out


@pytest.mark.parametrize("stem", list(PARAMS))
def test_notebook_executes_and_renders_charts(executed, stem):
    nb, seconds = executed[stem]
    assert errors(nb) == []
    assert has_chart(nb), f"{stem}: no chart image in the outputs (offline png renderer)"
    print(f"{stem}: {seconds:.1f} s", file=sys.stderr)


def test_explore_shows_prefix_reuse_of_a_trace_with_hashes(executed):
    nb, _ = executed["01-explore-trace"]
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "refs_seen_pct" in text and "no prefix hashes" not in text


def test_later_notebooks_reuse_the_duckdb_runs(executed):
    nb, _ = executed["06-production-evidence"]
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "No replay-based answer in this DB" not in text   # 03's size-swap demand run is found
    assert "replay.run_id" in text and "replay.peak_swapped_gib" in text
    assert "parts ways (windows)" in text and "itl_p99_s" in text      # replay vs. Prometheus ran


# ---- thinness --------------------------------------------------------------------------------

FORBIDDEN = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.For,
             ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_thin(path):
    cells = code_cells(path)
    for i, c in enumerate(cells):
        tree = ast.parse(c.source)
        bad = sorted({type(n).__name__ for n in ast.walk(tree) if isinstance(n, FORBIDDEN)})
        assert bad == [], f"{path.name} code cell {i}: {bad} — move the logic into a package"
        if "parameters" in c.metadata.get("tags", []):
            # Any length, but only `name = literal` lines (papermill overrides them).
            assert all(isinstance(n, ast.Assign) and len(n.targets) == 1
                       and isinstance(n.targets[0], ast.Name) and is_literal(n.value)
                       for n in tree.body), f"{path.name}: the parameters cell holds only literals"
        else:
            assert len(c.source.splitlines()) <= MAX_CELL_LINES, f"{path.name} code cell {i} is too long"


def is_literal(node) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped_and_parameterized(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    cells = code_cells(path)
    assert all(c.outputs == [] and c.execution_count is None for c in cells), "outputs not stripped"
    tagged = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"
    assert "db_path" in tagged[0].source
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ") and "Question" in first.source


def test_notebook_capacity_is_the_cli_capacity(executed, tmp_path):
    """Issue 31: one capacity and one replica count everywhere. Notebook 04 (the plan, then its
    tuning and capacity) against `kvcap headroom` on the same trace, engine, SLOs, budget and
    grid."""
    import re
    import subprocess

    from traces.loaders import write_trace
    from traces.synth import synthesize
    nb, _ = executed["04-max-num-seqs"]
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")
    m = re.search(r"headroom_rate_scale: (\S+) capacity_rps: (\S+) replicas: (\S+)", text)
    path = tmp_path / "flash.parquet"
    write_trace(synthesize("flash-crowd", **SMALL_FLASH), path)
    kvcap = str(Path(sys.executable).with_name("kvcap"))
    res = subprocess.run([kvcap, "headroom", str(path), "--num-gpu-blocks-override", "625",
                          "--max-num-seqs-grid", "32,64", "--workers", "1", "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    head = json.loads(res.stdout)
    assert m.group(1) == str(head["headroom_rate_scale"])
    assert m.group(2) == str(head["capacity_rps"])
    assert m.group(3) == str(head["replicas"]["count"])


def test_replay_notebook_drills_into_one_requests_stalls(executed):
    """02 records batches and shows one request's batches around its stalls (issue 20)."""
    nb, _ = executed["02-replay-and-preemption"]
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "preemption(s) shown" in text and "no preemption stall" not in text
    assert "batch_size" in text and "num_computed_tokens" in text
