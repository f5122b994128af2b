"""Layering (DESIGN §2, STYLE): traces <- replay <- capacity; torch only in the stub; the engine
core imports numpy only. Enforced by import-linter contracts in pyproject.toml."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_torch_is_imported_only_by_the_stub():
    """replay/stub/ and the fit that times it (replay/calibration/stub_fit.py), nothing else."""
    allowed = {ROOT / "replay" / "stub", ROOT / "replay" / "calibration" / "stub_fit.py"}
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] not in ("traces", "replay", "capacity"):
            continue
        text = path.read_text()
        if ("import torch" in text or "from torch" in text) \
                and not allowed & {path, *path.parents}:
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
