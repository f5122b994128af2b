"""The baseline's own charts, rendered while the plan searches (`kvcap report`).

A report's baseline is replayed first; its five charts (load and queues, KV usage, preemptions
per minute, TTFT and TBT CDFs) need nothing else. `ChartsAhead` starts a thread that imports the
report's modules (altair, vl-convert: about a second), waits for the baseline
(`make_plan(on_baseline=...)`) and renders them (`render_ahead`): the planning process mostly
waits for its workers meanwhile, and vl-convert renders outside Python's lock. `write_report`
takes the result (`Ahead`) and renders only the rest. This module imports nothing heavy: the
command line imports it before the report's modules are loaded.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Ahead:
    """A replay's summary and its own charts, rendered before the rest of the report."""
    run_id: str
    run_sum: dict
    figures: dict                               # name -> render.Figure
    rendered: dict[str, tuple[str, bytes]]      # name -> (SVG, PNG)


def render_ahead(run) -> Ahead:
    from capacity.analyses.metrics import summary
    from capacity.report.render import render_chart, run_figures
    s = summary(run.tables())
    figs = run_figures(run, s)
    return Ahead(run_id=run.run_id, run_sum=s, figures=figs,
                 rendered={name: render_chart(f.chart) for name, f in figs.items()})


class ChartsAhead:
    """The thread (see the module docstring): `baseline(run)` hands it the replay, `result()`
    waits for the charts."""

    def __init__(self) -> None:
        self._run = None
        self._given = threading.Event()
        self._ahead: Ahead | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def baseline(self, run) -> None:
        self._run = run
        self._given.set()

    def _work(self) -> None:
        try:
            # At the lowest CPU priority (Linux: per thread; the threads vl-convert starts from
            # here inherit it): on a busy machine the rendering takes the CPU the workers leave
            # idle, not theirs.
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except (AttributeError, OSError):
                pass
            import capacity.report.build  # noqa: F401  (the report's modules)
            self._given.wait()
            if self._run is not None:
                self._ahead = render_ahead(self._run)
        except BaseException as e:       # raised where the report is built (result)
            self._error = e

    def result(self) -> Ahead | None:
        """The rendered baseline charts, or None when the plan never gave a baseline; an error
        in the thread is raised here."""
        self._given.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._ahead
