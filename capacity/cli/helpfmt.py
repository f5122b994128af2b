"""`--help` that never cuts or splits a flag name, at any terminal width.

click's plain help (the group sets `rich_markup_mode=None`: typer's rich panels cut long flag
names to fit 80 columns, `--num-gpu-blocks-o…`) puts an option name longer than its column on a
line of its own, but wraps the help text with textwrap, which breaks words at hyphens
(`[default: offload-prompt-` / `only]`, a flag named in a help text). Here the text is wrapped
with its hyphens made non-breaking, then given back its hyphens: lines break at spaces only.
"""
from __future__ import annotations

import typer

try:                        # typer >= 0.2x carries its own click
    from typer._click import HelpFormatter as _HelpFormatter
except ImportError:         # a typer on the click package
    from click import HelpFormatter as _HelpFormatter

_NB_HYPHEN = "\u2011"


class HelpFormatter(_HelpFormatter):
    def write_text(self, text: str) -> None:
        self._unbroken(super().write_text, text.replace("-", _NB_HYPHEN))

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        rows = [(a, b.replace("-", _NB_HYPHEN)) for a, b in rows]
        self._unbroken(super().write_dl, rows, col_max, col_spacing)

    def _unbroken(self, write, *args) -> None:
        start = len(self.buffer)
        write(*args)
        self.buffer[start:] = [s.replace(_NB_HYPHEN, "-") for s in self.buffer[start:]]


class Context(typer.Context):
    formatter_class = HelpFormatter


def install(command) -> None:
    """Give a click command (a group: and all its loaded commands) this help formatter."""
    command.context_class = Context
    subs = getattr(command, "commands", None)
    if isinstance(subs, dict):          # a typer group (a lazy one installs its own on lookup)
        for sub in subs.values():
            install(sub)
