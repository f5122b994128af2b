"""`kvcap calibrate`: measure the torch stub on a device and write a cost-model profile."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from capacity.cli.common import emit_json, guarded

err = Console(stderr=True)


@guarded
def calibrate_cmd(
    output: Path = typer.Option(..., "-o", "--output", help="Profile JSON to write."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda | cpu (default: cuda when present)."),
    model: str = typer.Option("llama-3.1-8b", "--model", help="Catalog name, HF id or config.json path."),
    gpu: str = typer.Option("h100", "--gpu", help="Catalog GPU for the constants not fitted."),
    stub_shape: Optional[str] = typer.Option(None, "--stub-shape", help="full | tiny (default: full on CUDA, tiny on CPU)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto | fp8."),
    quick: bool = typer.Option(False, "--quick", help="A small grid (seconds; for tests and smoke checks)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure step shapes with the torch stub and fit the cost model's constants."""
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"--device: {device!r} is not cuda or cpu")
    if stub_shape not in (None, "full", "tiny"):
        raise ValueError(f"--stub-shape: {stub_shape!r} is not full or tiny")
    from replay.calibrate import CalibrationOptions, calibrate, write_profile
    opts = CalibrationOptions(device=device, model=model, gpu=gpu, stub_shape=stub_shape,
                              kv_cache_dtype=kv_cache_dtype, quick=quick)
    profile = calibrate(opts, log=None if as_json else (lambda m: err.print(m, highlight=False)))
    write_profile(profile, output)
    summary = {"profile": str(output), "device": profile["device"], "model": profile["model"],
               "constants": profile["constants"], "fit": profile["fit"],
               "bandwidth": profile["bandwidth"]}
    if as_json:
        emit_json(summary)
        return
    f, bw = profile["fit"], profile["bandwidth"]
    Console().print(f"wrote {output}: held-out step-time error {f['mape_heldout_pct']:.1f} % "
                    f"(train {f['mape_train_pct']:.1f} %, {f['num_train']}+{f['num_heldout']} shapes)")
    for k, v in profile["constants"].items():
        Console().print(f"  {k:<24} {v:.4g}")
    for k, v in bw.items():
        Console().print(f"  {k:<24} {v:.4g}")
