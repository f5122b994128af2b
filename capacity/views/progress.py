"""Progress a person can follow (issue 36 item 4): which phase, replays done of those planned so
far (the total grows as a search goes), elapsed time and an ETA.

`with phase("report: baseline, tuning, headroom…", quiet=quiet):` around a long call:
- on a terminal (or in Jupyter), a rich progress bar, gone when the phase ends;
- elsewhere (a pipe, CI, a log file), one plain line on stderr when the phase ends:
  `kvcap: report: … — 37 replays, 41.2 s`;
- `quiet` (or KVCAP_QUIET=1): nothing.
Every replay a Planner makes inside the block advances it (capacity/analyses/planner.py
`reporting`). Notebooks can use the same context manager around an analysis call.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeElapsedColumn)
from rich.table import Column
from rich.text import Text


class _Eta(ProgressColumn):
    """Time left at the average pace so far (replays of one search take alike; rich's own
    estimate waits for a steady speed, which a total that grows never gives)."""

    def render(self, task) -> Text:
        if not task.completed or task.total is None or task.elapsed is None:
            return Text("ETA -:--", style="cyan")
        left = max(task.total - task.completed, 0) * task.elapsed / task.completed
        m, s = divmod(int(round(left)), 60)
        return Text(f"ETA {m}:{s:02d}", style="cyan")


class _Bar:
    """A live rich bar for one phase (planner.Progress)."""

    def __init__(self, prog: Progress, task) -> None:
        self.prog, self.task = prog, task
        self.total = self.done = 0

    def planned(self, n: int) -> None:
        self.total += n
        self.prog.update(self.task, total=self.total)

    def replayed(self, label: str) -> None:
        self.done += 1
        self.prog.update(self.task, completed=self.done, detail=label)


class _Count:
    """Counts replays for the plain line printed when the phase ends."""

    def __init__(self) -> None:
        self.total = self.done = 0

    def planned(self, n: int) -> None:
        self.total += n

    def replayed(self, label: str) -> None:
        self.done += 1


def quiet_from_env() -> bool:
    return os.environ.get("KVCAP_QUIET", "") not in ("", "0")


@contextlib.contextmanager
def phase(name: str, *, quiet: bool = False, console: Console | None = None) -> Iterator[None]:
    """Show the progress of the replays made within the block (see the module docstring)."""
    from capacity.analyses.planner import reporting     # the analyses' imports, when used
    if quiet or quiet_from_env():
        with reporting(None):
            yield
        return
    console = console or Console(stderr=True)
    if console.is_terminal or console.is_jupyter:
        cols = (TextColumn("[bold]{task.description}",
                           table_column=Column(max_width=36, no_wrap=True, overflow="ellipsis")),
                BarColumn(bar_width=20), MofNCompleteColumn(), TextColumn("replays"),
                TimeElapsedColumn(), _Eta(),
                TextColumn("[dim]{task.fields[detail]}",
                           table_column=Column(max_width=22, no_wrap=True, overflow="ellipsis")))
        with Progress(*cols, console=console, transient=True) as prog:
            task = prog.add_task(name, total=None, detail="")
            with reporting(_Bar(prog, task)):
                yield
        return
    count, t0 = _Count(), time.monotonic()
    with reporting(count):
        yield
    console.print(f"kvcap: {name.rstrip('…. ')} — {count.done} replay"
                  f"{'' if count.done == 1 else 's'}, {time.monotonic() - t0:.1f} s",
                  highlight=False, soft_wrap=True)
