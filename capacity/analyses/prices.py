"""$/GPU-hour for `kvcap plan`'s cheapest fleet: a default table and the user's overrides.

The defaults are round, illustrative on-demand prices per GPU-hour of the order cloud and GPU
providers list for these parts; they are not quotes and go stale. Plans that matter should pass
their own (`--gpu-price h100=2.49`, or `--prices FILE` with a YAML/JSON mapping gpu: USD).
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_USD_PER_GPU_HOUR: dict[str, float] = {
    "a100-40gb": 1.50, "a100-80gb": 2.00, "h100": 3.00, "h100-pcie": 2.50, "h200": 4.00,
    "l40s": 1.20, "b200": 6.00,
}


def _price(value, where: str) -> float:
    try:
        usd = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not a price; give USD per GPU-hour, e.g. 2.49") from None
    if not (usd >= 0 and usd < 1e6):
        raise ValueError(f"{where}: {usd!r} is out of range; give USD per GPU-hour >= 0")
    return usd


def price_table(overrides: list[str] | None = None, file: Path | None = None) -> dict[str, float]:
    """Defaults, then `file` (mapping gpu -> USD), then `overrides` ("gpu=USD")."""
    from replay.timing.catalog import get_gpu
    prices = dict(DEFAULT_USD_PER_GPU_HOUR)
    if file is not None:
        import yaml
        try:
            data = yaml.safe_load(Path(file).read_text())
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" line {mark.line + 1}" if mark else ""
            raise ValueError(f"{file}{at}: not YAML/JSON ({getattr(e, 'problem', e)})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{file}: give a mapping gpu: USD per GPU-hour (e.g. h100: 2.49)")
        for gpu, usd in data.items():
            prices[get_gpu(str(gpu)).name] = _price(usd, f"{file}: {gpu}")
    for item in overrides or []:
        gpu, sep, usd = item.partition("=")
        if not sep:
            raise ValueError(f"--gpu-price {item!r}: give GPU=USD, e.g. h100=2.49")
        prices[get_gpu(gpu.strip()).name] = _price(usd.strip(), f"--gpu-price {item}")
    return prices
