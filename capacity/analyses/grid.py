"""Sweep grids: `--grid 'max_num_seqs=64,128;rate_scale=1,2'` or a YAML file, to grid points.

A grid is a mapping of keys to lists of values; the points are their Cartesian product, in the
order written (the last key varies fastest). Keys: any `EngineConfig` field in vLLM's spelling
(`max_num_seqs`, `max-num-seqs` and `--max-num-seqs` alike), `rate_scale`, and `trace` (paths;
relative ones from the YAML file's folder). Values are typed by the field: the defaults' types,
`none` for "vLLM's default", true/false for switches. A bad key or value is one line naming it
(and, for a file, the line).

YAML form:
    grid:
      max_num_seqs: [64, 128]
      rate_scale: [1, 2]
      enable_prefix_caching: [true, false]
(or the mapping at the top level).
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from replay.config import EngineConfig

SPECIAL = ("rate_scale", "trace")
MAX_POINTS = 100_000
_TRUE, _FALSE, _NONE = {"true", "on", "yes"}, {"false", "off", "no"}, {"none", "null", "default"}


def _fields() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def canonical_key(key: str, where: str) -> str:
    name = str(key).strip().lstrip("-").replace("-", "_")
    if name == "tp":
        name = "tensor_parallel_size"
    if name not in _fields() and name not in SPECIAL:
        known = ", ".join(sorted(_fields()) + list(SPECIAL))
        raise ValueError(f"{where}: unknown grid key {key!r}; use an engine field ({known})")
    return name


def _kind(name: str) -> type:
    """The field's value type from its annotation (`int | None` -> int; Literal aliases: str)."""
    if name == "rate_scale":
        return float
    ann = next(str(f.type) for f in dataclasses.fields(EngineConfig) if f.name == name)
    for kind in (bool, int, float):
        if kind.__name__ in ann.replace(" ", "").split("|"):
            return kind
    return str


def typed(name: str, raw, where: str):
    """`raw` (text from the command line, or a YAML scalar) as the field's type; `none` is
    "vLLM's default" for the fields that have one."""
    if name == "trace":
        return str(raw)
    kind, text = _kind(name), str(raw).strip()
    low = text.lower()
    if low in _NONE and name != "rate_scale":
        if _fields()[name] is not None:
            raise ValueError(f"{where}: {name}={raw!r}: this field has no 'vLLM default'; give a value")
        return None
    if kind is bool:
        if isinstance(raw, bool) or low in _TRUE | _FALSE:
            return raw if isinstance(raw, bool) else low in _TRUE
        raise ValueError(f"{where}: {name}={raw!r}: give true or false")
    if kind is str:
        return text
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{where}: {name}={raw!r} is not a number") from None
    if kind is float:
        return number
    if number != int(number):
        raise ValueError(f"{where}: {name}={raw!r}: give a whole number")
    return int(number)


def parse_grid_text(text: str) -> dict[str, list]:
    """'key=v1,v2;key2=v3' -> {key: [values]} (keys canonical, values typed)."""
    grid: dict[str, list] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, sep, values = part.partition("=")
        if not sep or not values.strip():
            raise ValueError(f"--grid: {part!r}: give key=value[,value...], e.g. max_num_seqs=64,128")
        name = canonical_key(key, "--grid")
        if name in grid:
            raise ValueError(f"--grid: key {name} is given twice")
        grid[name] = [typed(name, v, "--grid") for v in values.split(",") if v.strip()]
    return grid


def parse_grid_file(path: Path) -> dict[str, list]:
    """A YAML (or JSON) grid file; `trace` paths are taken relative to the file's folder."""
    import yaml
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the grid file ({e.strerror or e})") from None
    try:
        nodes = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark else ""
        raise ValueError(f"{path}{at}: not YAML ({getattr(e, 'problem', None) or e})") from None
    lines = _key_lines(nodes)
    if isinstance(data, dict) and "grid" in data:
        data = data["grid"]
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: give a mapping of grid keys to lists of values (under 'grid:')")
    grid: dict[str, list] = {}
    for key, values in data.items():
        where = f"{path}:{lines.get(str(key), '?')}"
        name = canonical_key(key, where)
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ValueError(f"{where}: {key} has no values")
        vals = [typed(name, v, where) for v in values]
        if name == "trace":
            vals = [str(p if Path(p).is_absolute() else (path.parent / p)) for p in vals]
        grid[name] = vals
    return grid


def _key_lines(node) -> dict[str, int]:
    """Line (1-based) of every mapping key in the YAML document."""
    out: dict[str, int] = {}
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if hasattr(n, "value") and isinstance(n.value, list):
            for item in n.value:
                if isinstance(item, tuple):
                    k, v = item
                    out.setdefault(str(k.value), k.start_mark.line + 1)
                    stack.append(v)
                else:
                    stack.append(item)
    return out


def points(grid: dict[str, list]) -> list[dict]:
    """The Cartesian product of the grid, one dict per point."""
    keys = list(grid)
    total = 1
    for k in keys:
        total *= max(len(grid[k]), 1)
    if total > MAX_POINTS:
        raise ValueError(f"--grid: {total:,} points is more than {MAX_POINTS:,}; split the sweep")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def engine_for(base: EngineConfig, point: dict, where: str = "--grid") -> EngineConfig:
    """`base` with the point's engine fields (validated: a bad combination names the point)."""
    fields = {k: v for k, v in point.items() if k not in SPECIAL}
    try:
        return dataclasses.replace(base, **fields)
    except (ValueError, TypeError) as e:
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        raise ValueError(f"{where}: point {text}: {str(e).splitlines()[0]}") from None
