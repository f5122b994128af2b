"""Issue 36 item 4: progress a person can follow. Every replay a Planner makes advances the
current phase (the total grows as searches plan more); a non-terminal gets one plain line per
phase on stderr; --quiet (or KVCAP_QUIET) nothing."""
from __future__ import annotations

import io

from rich.console import Console

from capacity.analyses.planner import Planner, summary_reducer
from capacity.analyses.sweep import Job
from capacity.views.progress import phase
from replay.config import EngineConfig
from traces.loaders import load_trace

from capacity_helpers import CONV


def _jobs(n: int, tag: str):
    trace = load_trace(CONV).head(200)
    return [Job(trace=trace, config=EngineConfig(max_num_seqs=8 * (i + 1)), label=f"{tag} {i}")
            for i in range(n)]


def test_plain_line_per_phase_counts_replays_not_reuses(monkeypatch):
    monkeypatch.delenv("KVCAP_QUIET", raising=False)
    out = io.StringIO()
    con = Console(file=out, force_terminal=False, width=200)
    p = Planner(workers=1)
    jobs = _jobs(3, "p")
    with phase("report: baseline, tuning…", console=con):
        p.run(jobs[:2])
        p.run(jobs)                                   # two reused, one new
        p.map(jobs[:1], summary_reducer())            # reduced from its full replay: no replay
        p.map(_jobs(4, "p")[3:], summary_reducer())   # a summary replay counts
    with phase("report: charts…", console=con):
        p.run(jobs)                                   # all reused
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("kvcap: report: baseline, tuning — 4 replays, ")
    assert lines[0].endswith(" s") and lines[1].startswith("kvcap: report: charts — 0 replays")


def test_quiet_says_nothing(monkeypatch):
    out = io.StringIO()
    con = Console(file=out, force_terminal=False)
    with phase("headroom…", quiet=True, console=con):
        Planner(workers=1).run(_jobs(1, "q"))
    monkeypatch.setenv("KVCAP_QUIET", "1")
    with phase("headroom…", console=con):
        Planner(workers=1).run(_jobs(1, "q"))
    assert out.getvalue() == ""


def test_terminal_bar_total_grows(monkeypatch):
    monkeypatch.delenv("KVCAP_QUIET", raising=False)
    out = io.StringIO()
    con = Console(file=out, force_terminal=True, width=160)
    p = Planner(workers=1)
    with phase("tune", console=con):
        p.run(_jobs(2, "a"))
        p.run(_jobs(3, "b"))
    text = out.getvalue()
    assert "tune" in text and "3/3" in text and "replays" in text   # two of b reuse a
