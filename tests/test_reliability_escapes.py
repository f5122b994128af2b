"""Issue 34 item 6: text from data reaches the terminal escaped (one function, capacity.cli.common
.shown: control characters as \\x1b, Rich markup as text) — Prometheus server labels in `validate
--prometheus`, tenants and file names in `trace info` and `logs`, stored labels in `runs`, a config's
`_name_or_path`; and `--model-name` with a line break YAML knows (NEL, LS) or a control character is
refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capacity.cli.common import shown

ROOT = Path(__file__).resolve().parents[1]
KVCAP_MAIN = "import sys; from capacity.cli import console; sys.argv[0] = 'kvcap'; console()"
ESC = "\x1b[2J\x1b]0;owned\x07"
STATS = ("INFO 01-25 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
         "Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache "
         "usage: 1.0%, Prefix cache hit rate: 0.0%\n")


def kvcap(*args, rc=0):
    res = subprocess.run([sys.executable, "-c", KVCAP_MAIN, *map(str, args)], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200"),
                         timeout=300)
    assert res.returncode == rc, res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout, res.stdout
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr, res.stderr
    return res


def test_shown_escapes_controls_and_markup():
    s = shown(ESC + "[bold]x")
    assert "\x1b" not in s and "\x07" not in s and s.startswith("\\x1b") and s.endswith("\\[bold]x")
    assert shown("plain") == "plain"


def test_trace_info_tenants_and_file_name(tmp_path):
    f = tmp_path / f"t{ESC}.csv"
    f.write_text(f'arrival_s,prompt_tokens,output_tokens,tenant\n0,10,5,"a{ESC}"\n0.5,20,3,b\n')
    out = kvcap("trace", "info", f).stdout
    assert "\\x1b" in out


def test_logs_file_names(tmp_path):
    f = tmp_path / f"server{ESC}.log"
    f.write_text(STATS)
    bad = tmp_path / f"bad{ESC}.log"
    bad.write_text("nothing here\n")
    res = kvcap("logs", f, bad, "--db", tmp_path / "k.duckdb")
    assert "\\x1b" in res.stdout and "\\x1b" in res.stderr


def test_runs_stored_labels_and_config_name(tmp_path):
    t = tmp_path / f"t{ESC}.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    cfg = {"_name_or_path": f"org/m{ESC}", "architectures": ["LlamaForCausalLM"], "hidden_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
           "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    db = tmp_path / "k.duckdb"
    kvcap("replay", t, "--model", tmp_path / "config.json", "--label", f"run{ESC}", "--db", db)
    out = kvcap("runs", "--db", db).stdout
    assert "\\x1b" in out and ESC not in out


def test_validate_prometheus_server_label(tmp_path):
    from capacity.evidence.logs import ingest_files
    from replay.config import EngineConfig
    from replay.run import replay
    from replay.results.store import write_run
    from test_prom_validate import render_scrapes
    from traces.synth import synthesize
    run = replay(synthesize("poisson", rate_rps=2.0, duration_s=30, seed=1),
                 EngineConfig(num_gpu_blocks_override=500))
    db = tmp_path / "ev.duckdb"
    write_run(db, run.tables())
    server = f"srv{ESC}"
    render_scrapes(run, tmp_path / server)
    ingest_files([tmp_path / server], db, window_s=10.0)
    out = kvcap("validate", "--db", db, "--run", run.run["run_id"], "--prometheus",
                "--server", server).stdout
    assert "srv\\x1b" in out


@pytest.mark.parametrize("name", ["llama\u0085x", "llama\u2028x", "llama\x1bx", "a\nb"])
def test_model_name_with_a_line_break_or_control_is_refused(tmp_path, name):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    out = tmp_path / "rules.yml"
    res = kvcap("alerts", t, "--model-name", name, "-o", out, rc=2)
    assert "--model-name" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()
