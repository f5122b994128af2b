"""Shared by the capacity CLI tests: the conv800 trace file and running kvcap for its JSON."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="module")
def conv800(tmp_path_factory):
    """The first 800 requests of Azure conv as a Parquet file."""
    from traces.loaders import load_trace, write_trace
    path = tmp_path_factory.mktemp("t") / "conv800.parquet"
    write_trace(load_trace(CONV).head(800), path)
    return path


def kvcap(*args, rc=0):
    res = subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == rc, res.stderr
    return res


def kvcap_json(*args):
    return json.loads(kvcap(*args, "--json").stdout)
