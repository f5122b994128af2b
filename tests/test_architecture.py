"""Layering (DESIGN §2, STYLE): traces <- replay <- capacity; inside replay/, fleet and calibration
on run, run on config / stub / results, those on the engine, the engine on timing; torch only in
the stub; the engine core imports numpy only. Enforced by import-linter contracts in
pyproject.toml."""
import shutil
import subprocess
import sys
import tomllib
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


def test_every_part_of_replay_has_a_layer():
    """A new module or sub-package directly under replay/ must be placed in the layers contract
    (else import-linter would let it import, and be imported by, anything)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in contracts["contracts"]
                  if c["type"] == "layers" and c["name"].startswith("replay's parts"))
    placed = {m.strip() for layer in layers for m in layer.split("|")}
    parts = {f"replay.{p.stem}" for p in (ROOT / "replay").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert parts == placed
