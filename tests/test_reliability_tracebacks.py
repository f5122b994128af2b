"""Issue 34 items 7 and 8 (the cases fixed here): what ended in a traceback or was accepted as
nonsense is one line naming the flag or file and the fix, exit 2, nothing written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traces import atomic

ROOT = Path(__file__).resolve().parents[1]
KVCAP_MAIN = "import sys; from capacity.cli import console; sys.argv[0] = 'kvcap'; console()"
BENCH = ROOT / "tests" / "data" / "logs" / "bench_v0.json"


def kvcap(*args):
    res = subprocess.run([sys.executable, "-c", KVCAP_MAIN, *map(str, args)], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, res.stderr


@pytest.fixture()
def trace(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n1.0,30,4\n")
    return f


@pytest.mark.parametrize("args,flag", [
    (("replay", "{t}", "--hash-block-tokens", "2147483648"), "--hash-block-tokens"),
    (("trace", "info", "{t}", "--hash-block-tokens", "2147483648"), "hash_block_tokens"),
    (("size-swap", "{t}", "--scheduler", "v0", "--host-ram-gib", "1e300"), "--host-ram-gib"),
    (("trace", "synth", "gamma", "--param", "cv=1e300", "-o", "{d}/g.parquet"), "cv"),
    (("replay", "{t}", "--rate-scale", "1e-300"), "--rate-scale"),
    (("calibrate", "--from-bench", str(BENCH), "-o", "{d}/p.json", "--max-error-pct", "-1"),
     "--max-error-pct"),
    (("calibrate", "--from-bench", str(BENCH), "-o", "{d}/p.json", "--max-error-pct", "nan"),
     "--max-error-pct"),
])
def test_out_of_range_values_are_one_line(tmp_path, trace, args, flag):
    code, err = kvcap(*(a.format(t=trace, d=tmp_path) for a in args))
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("*.parquet")) and not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("change,what", [
    (lambda d: d.update(output_lens=[1] * len(d["output_lens"]),
                        itls=[[] for _ in d["output_lens"]]), "2 or more output tokens"),
    (lambda d: d.update(input_lens=[0] * len(d["input_lens"])), "every input length is 0"),
])
def test_calibrate_from_bench_without_tpot_or_prompts(tmp_path, change, what):
    d = json.loads(BENCH.read_text())
    change(d)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(d))
    code, err = kvcap("calibrate", "--from-bench", bench, "-o", tmp_path / "p.json")
    assert code == 2 and what in err and not (tmp_path / "p.json").exists()


def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount (a 64 KiB tmpfs stands for a full disk)")
    return mnt


def test_parquet_on_a_full_disk_is_one_line(tmp_path):
    mnt = small_disk(tmp_path)
    try:
        code, err = kvcap("trace", "synth", "poisson", "--duration-s", "3000", "-o", mnt / "x.parquet")
        assert code == 2 and "No space left" in err and len(err.strip().splitlines()) == 1
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_report_on_a_full_disk_leaves_no_partial_report(tmp_path, trace):
    mnt = small_disk(tmp_path)
    try:
        code, err = kvcap("report", trace, "-o", mnt / "rep", "--workers", "1")
        assert code == 2 and "No space left" in err
        assert not (mnt / "rep").exists() or list((mnt / "rep").iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_write_files_is_all_or_nothing(tmp_path):
    (tmp_path / "a.txt").write_text("old a")
    with pytest.raises(atomic.OutputRefused):
        atomic.write_files({tmp_path / "a.txt": "new a", tmp_path / "b.txt": b"new b",
                            tmp_path: "a folder"})
    assert (tmp_path / "a.txt").read_text() == "old a" and not (tmp_path / "b.txt").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_zero_kv_heads_is_not_mha(tmp_path, trace):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 0, "intermediate_size": 1024,
           "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, err = kvcap("replay", trace, "--model", tmp_path / "config.json")
    assert code == 2 and "num_key_value_heads 0" in err and len(err.strip().splitlines()) == 1
