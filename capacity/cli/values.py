"""Command-line values without pydantic, where the answer is plain.

typer (0.29) turns every parameter value into its Python type through a pydantic TypeAdapter
built per parameter on first use; for `kvcap replay` (35 parameters) importing pydantic and
building the adapters was about 0.1 s of a 1.4 s process. `install` gives each parameter whose
type is str, int, float, bool or a plain Path a converter that handles the plain spellings
itself (a decimal integer, a decimal fraction, any string, a path) with the result typer gives
them, and hands every other value — and every other parameter — to typer's own converter, so
what is accepted, and the error message of what is not, stay typer's.
"""
from __future__ import annotations

import re
from pathlib import Path

# What Python and pydantic read alike (no sign, exponent, underscores or spaces: those go to typer).
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?[0-9]{1,18}(?:\.[0-9]{1,18})?")
_MISS = object()


def _plain(annotation, value):
    """`value` converted as typer would, or _MISS when the value is not a plain spelling."""
    if annotation is str:
        return value if isinstance(value, str) else _MISS
    if annotation is bool:
        return value if isinstance(value, bool) else _MISS
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, str) and _INT.fullmatch(value) else _MISS
    if annotation is float:
        if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
            return float(value)
        return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else _MISS
    if isinstance(value, Path):
        return value
    return Path(value) if isinstance(value, str) and value and "\0" not in value else _MISS


class PlainValues:
    """typer's runtime converter for one parameter (`coerce(value, param=, ctx=)`), plain
    spellings first; typer's own (pydantic) converter is built only when a value needs it."""

    def __init__(self) -> None:
        self._typer = None

    def coerce(self, value, param, ctx):
        if value is None:
            return None
        desc = param.type_descriptor
        out = _plain(desc.annotation, value)
        if out is _MISS:
            return self._full(desc).coerce(value, param=param, ctx=ctx)
        if desc.annotation is Path:
            # typer's own path checks (exists, file/dir) on the Path it would have made.
            from typer._param_types import coerce_cli_path
            return coerce_cli_path(out, desc.parameter_info, path_type=Path, param=param, ctx=ctx)
        return out

    def _full(self, desc):
        if self._typer is None:
            from typer._coercion import build_runtime_param
            self._typer = build_runtime_param(desc)
        return self._typer


def _plain_parameter(param) -> bool:
    desc = getattr(param, "type_descriptor", None)
    if desc is None or getattr(param, "_runtime_param", _MISS) is not None:
        return False
    info = desc.parameter_info
    if (desc.annotation not in (str, int, float, bool, Path) or desc.file_annotation is not None
            or param.multiple or param.nargs != 1 or desc.is_choice
            or getattr(info, "parser", None) is not None
            or getattr(info, "min", None) is not None or getattr(info, "max", None) is not None):
        return False
    # A Path with typer's path options (resolve, '-', a path_type) stays typer's.
    return desc.annotation is not Path or not (info.resolve_path or info.allow_dash
                                                or info.path_type is not None)


def install(command) -> None:
    """Give the plain parameters of a click command (a group: of all its commands) PlainValues.
    A typer without these internals keeps its own converters (slower, same results)."""
    try:
        from typer._coercion import build_runtime_param  # noqa: F401
        from typer._param_types import coerce_cli_path  # noqa: F401
    except ImportError:
        return
    subs = getattr(command, "commands", None)
    if isinstance(subs, dict):          # a typer group (a lazy one installs its own on lookup)
        for sub in subs.values():
            install(sub)
    for param in command.params:
        plain(param)
    # click makes `--help` when the command is parsed (its names depend on the context).
    made = command.get_help_option

    def get_help_option(ctx):
        return plain(made(ctx))
    command.get_help_option = get_help_option


def plain(param):
    """`param` (a typer parameter, or None), given PlainValues where its type is plain."""
    if param is not None and _plain_parameter(param):
        param._runtime_param = PlainValues()
    return param
