"""The planner: one object that owns the replay memo and the worker pool for a whole analysis.

Two ways to ask for replays:

- `run(jobs)` / `replay(trace, config, label)` / `run_shared(jobs)`: full `RunResult`s, every
  table in memory — for the replays a person looks at (the baseline, the recommended
  configuration). `runs` lists them, in the order made, for the caller to store (DuckDB has one
  writer: the caller).
- `map(jobs, reduce)` / `map_shared(jobs, reduce)`: one small value per job, `reduce(tables)`
  computed in the worker that replayed it — for searches (headroom, tuning, offload, fleet).
  The worker replays in summary mode (replay/results/summary.py): no per-step tables are built, so a
  replay's memory is its requests, not its steps, and nothing but the value crosses back.
  `tables` is `RunResult.tables()` with `steps` / `tbt` standing in as summaries: what
  `criteria.evaluate`, `stability.stability`, `classify.classify` and `metrics.summary` read
  gives exactly the numbers of the full tables (tests/test_summary_replays.py); a reducer that
  reads anything else of them (rows) fails loudly.
  `reduce` is a `Reducer` (`reducer(fn, **kwargs)`, or the ready-made `score_reducer`,
  `summary_reducer`), a module-level function or a functools.partial of one (it is pickled to
  the worker), or a list of those, one per job. Its identity (qualified name + arguments) is
  part of the memo key, with the replay's key: the same job reduced the same way is replayed
  once per planner. A job already replayed in full is reduced from its tables, not replayed.
  `reduced` lists the `runs` rows of the replays made for `map` (label, run_id, status, ...).

    planner = Planner(workers=2)
    score = score_reducer(slo_ttft_s=1.0, slo_tbt_s=0.1, budget=Budget())
    for cand, st in planner.map_shared(jobs, score):    # (Candidate, Stability) per job
        print(cand.run_id, cand.feasible, st.sustainable)
    # any module-level function of the tables, one reducer per job:
    points = planner.map_shared(jobs, [reducer(load_point, spec=SCORE_SPEC, rate_scale=s,
                                               surge=False, slo_ttft_p99_s=1.0,
                                               slo_tbt_p99_s=0.1, budget=Budget())
                                       for s in scales])

Questions asked ahead: a summary replay keeps no tables, so a reducer asked of a job after its
summary replay replays it again. `with planner.asking_too((reducer, when), ...):` has every
summary replay of a job that `when(job)` holds for answer `reducer` too, for later (the plan asks
its capacity search's ×1 question of its tuning candidates this way). `repeated` lists the jobs
replayed in summary mode more than once; `replays_made` counts every replay.

Progress: every replay the planner starts and finishes is told to the `Progress` set by
`reporting(...)` (the bar of capacity/views/progress.py: the CLI's and the notebooks'), if any.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import polars as pl

from capacity.analyses.sweep import Job, Reduced, _reduce, execute, job_key, run_jobs
from replay.config import EngineConfig
from replay.results.summary import SummarySpec
from replay.results.tables import RunResult


class Progress(Protocol):
    def planned(self, n: int) -> None:
        """`n` more replays are to be made (the total may grow as a search goes)."""

    def replayed(self, label: str) -> None:
        """One replay is done."""


_PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "kvcap_progress", default=None)


@contextlib.contextmanager
def reporting(progress: Progress | None) -> Iterator[None]:
    """Within the block, planners tell `progress` of the replays they make."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


# ------------------------------------------------------------------ reducers
# What evaluate / stability / classify need: the TBT P99 (kept in memory) and 60-s windows. The
# default SummarySpec also keeps the TBT median (metrics.summary's tbt_p50_s), which needs every
# sample (spilled to a temporary file: ~10% slower on a day of traffic).
SCORE_SPEC = SummarySpec(tbt_quantiles=(0.99,))


@dataclass(frozen=True, slots=True)
class Reducer:
    """fn(tables, **kwargs), with the summary its replay must keep. `fn` is module-level."""
    fn: Callable[..., Any]
    kwargs: tuple[tuple[str, Any], ...] = ()
    spec: SummarySpec = SummarySpec()

    def __call__(self, tables: dict) -> Any:
        return self.fn(tables, **dict(self.kwargs))

    @property
    def key(self) -> str:
        return f"{_qualname(self.fn)}({self.kwargs!r})"


def reducer(fn: Callable[..., Any], *, spec: SummarySpec = SummarySpec(), **kwargs) -> Reducer:
    """`Reducer(fn, kwargs)`: `fn(tables, **kwargs)` computed where the replay ran."""
    return Reducer(fn, tuple(sorted(kwargs.items())), spec)


def _qualname(fn) -> str:
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    if "<lambda>" in name or "<locals>" in name:
        raise ValueError(f"reduce: {name} cannot be sent to a worker; use a module-level "
                         f"function (or functools.partial of one)")
    return name


def _key_of(reduce) -> str:
    if isinstance(reduce, Reducer):
        return reduce.key
    if isinstance(reduce, functools.partial):
        return f"{_qualname(reduce.func)}({reduce.args!r}, {sorted(reduce.keywords.items())!r})"
    return f"{_qualname(reduce)}()"


@dataclass(frozen=True, slots=True, kw_only=True)
class Unanswered:
    """What a question asked ahead (`Planner.asking_too`) gives where it fails: nothing is
    memoized, so asking it for real replays the job and fails (or answers) there."""
    error: str


def _answer_ahead(tables: dict, *, reduce) -> Any:
    try:
        return reduce(tables)
    except Exception as e:        # a question for later must not fail the replay asked now
        return Unanswered(error=f"{type(e).__name__}: {e}")


def _ahead(reduce: Reducer) -> Reducer:
    return Reducer(_answer_ahead, (("reduce", reduce),), _spec_of(reduce))


def _spec_of(reduce) -> SummarySpec:
    return reduce.spec if isinstance(reduce, Reducer) else SummarySpec()


def _union(specs: Sequence[SummarySpec]) -> SummarySpec:
    return SummarySpec(tbt_quantiles=tuple(sorted({q for s in specs for q in s.tbt_quantiles})),
                       windows_s=tuple(sorted({w for s in specs for w in s.windows_s})))


def score(tables: dict, *, slo_ttft_s: float, slo_tbt_s: float, budget, config=None):
    """(criteria.evaluate(...) -> Candidate, stability.stability(...) -> Stability)."""
    from capacity.analyses.criteria import evaluate
    from capacity.analyses.stability import stability
    return (evaluate(tables, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s, budget=budget,
                     config=config), stability(tables))


def score_reducer(*, slo_ttft_s: float, slo_tbt_s: float, budget, config=None) -> Reducer:
    """Reduces a replay to (Candidate, Stability); `config` (a resolved engine) names the
    candidate as in `evaluate`. Keeps the TBT P99 only (no spill of every sample)."""
    return reducer(score, spec=SCORE_SPEC, slo_ttft_s=slo_ttft_s,
                   slo_tbt_s=slo_tbt_s, budget=budget, config=config)


def summarize(tables: dict, *, slo_ttft_s: float | None = None,
              slo_tbt_s: float | None = None) -> dict:
    from capacity.analyses.metrics import summary
    return summary(tables, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s)


def summary_reducer(*, slo_ttft_s: float | None = None, slo_tbt_s: float | None = None) -> Reducer:
    """Reduces a replay to metrics.summary(...) (a dict; the TBT median included)."""
    return reducer(summarize, spec=SummarySpec(tbt_quantiles=(0.5, 0.99)),
                   slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s)


# ------------------------------------------------------------------ the planner
class Planner:
    def __init__(self, *, workers: int | None = None, trace_name: str = "",
                 keep_tables: bool = False, spill: bool = False) -> None:
        """`keep_tables`: `map` replays in full too and keeps every replay's tables (for a
        caller that stores them all, `--db`); the values are the same either way."""
        self.workers = workers
        self.trace_name = trace_name
        self.keep_tables = keep_tables
        # `run` spills the replays it makes in this process too (`run_jobs(spill=True)`): a
        # fleet scored in a worker of its own (capacity/analyses/replicas.py).
        self.spill = spill
        self._memo: dict[str, RunResult] = {}
        self._values: dict[tuple[str, str], Any] = {}    # (job key, reducer key) -> value
        self._reduced: dict[str, Reduced] = {}           # job key -> its latest summary replay
        # Replays made, and the jobs replayed in summary mode more than once: a reducer asked
        # after its job's summary replay replays it again (no tables were kept). A procedure
        # that knows its later questions asks them as the replays are made (`asking_too`);
        # tests hold `repeated` empty on the plan (issue 36: identical replays run once).
        self.replays_made = 0
        self._summarized: dict[str, list[str]] = {}     # job key -> labels of its summary replays
        self._asking_too: tuple[tuple[Reducer, Callable[[Job], bool]], ...] = ()

    def run(self, jobs: Sequence[Job], *, workers: int | None = None,
            on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
        """Replay every job (reusing earlier replays); results in input order."""
        return run_jobs(jobs, workers=workers or self.workers, on_done=on_done, memo=self._memo,
                        progress=_Tally(self, _PROGRESS.get()), spill=self.spill)

    def replay(self, trace: pl.DataFrame, config: EngineConfig, label: str) -> RunResult:
        """One replay a person looks at (a plan's baseline, its recommended flags), made in this
        process with its steps and TBT samples spilled to files past a million steps
        (`run_jobs(spill=True)`): a report holds it to the end, so a day of traffic must not
        hold gigabytes of step rows meanwhile. Readers take the columns they need
        (`steps.select(...)`, `steps[name].max()`)."""
        return run_jobs([Job(trace=trace, config=config, label=label,
                             trace_name=self.trace_name)], workers=1, memo=self._memo,
                        progress=_Tally(self, _PROGRESS.get()), spill=True)[0]

    def run_shared(self, jobs: Sequence[Job]) -> list[RunResult]:
        """Like `run`, but jobs that differ only by max_num_seqs run smallest first, and a larger
        value reuses the smaller one's replay when that replay never filled its max_num_seqs: the
        limit never bound, so the larger value replays identically. Groups run in parallel."""
        def one_round(heads: list[int]) -> dict[int, int]:
            runs = self.run([jobs[i] for i in heads])
            for i, r in zip(heads, runs):
                done[i] = r
            return {i: _peak_running(r) for i, r in zip(heads, runs)}

        def reuse(head: int, k: int) -> None:
            done[k] = done[head]
            self.remember(jobs[k], done[head])

        done: dict[int, RunResult] = {}
        _shared_rounds(jobs, one_round, reuse)
        return [done[i] for i in range(len(jobs))]

    def map(self, jobs: Sequence[Job], reduce, *, workers: int | None = None) -> list:
        """reduce(tables) of each job's replay, computed in the worker (see the module
        docstring); results in input order. `reduce`: one reducer, or a list, one per job."""
        return self._values_of(list(zip(jobs, _per_job(reduce, len(jobs)))), workers)

    @contextlib.contextmanager
    def asking_too(self, *asks: tuple[Reducer, Callable[[Job], bool]]) -> Iterator[None]:
        """Within the block, every summary replay of a job for which `when(job)` holds answers
        `reducer` too, for each (reducer, when) in `asks` (and in any enclosing block), memoized
        for a later `map` of the same replay: a summary replay keeps no tables, so a question
        asked after it would replay it again. A question that fails there is not memoized
        (asked later, it replays and fails then). `when` should hold only where the question
        will come: a reducer that needs more of a replay (SummarySpec) costs every replay it
        is added to."""
        before = self._asking_too
        self._asking_too = before + tuple(asks)
        try:
            yield
        finally:
            self._asking_too = before

    def map_shared(self, jobs: Sequence[Job], reduce) -> list:
        """`map` with `run_shared`'s reuse: a job that differs from a smaller one only by a
        max_num_seqs that replay never filled takes its own reducer's value of that replay."""
        reducers = _per_job(reduce, len(jobs))
        groups: dict[str, list[int]] = {}
        for i, j in enumerate(jobs):
            groups.setdefault(_group_key(j), []).append(i)
        left = set(range(len(jobs)))

        def one_round(heads: list[int]) -> dict[int, int]:
            # A head's worker also applies the reducers of the jobs its replay may stand for,
            # so a job that reuses it gets its own reducer's value (its own config's name).
            pairs = [(jobs[h], reducers[k]) for h in heads
                     for k in groups[_group_key(jobs[h])] if k in left]
            self._values_of(pairs, None)
            left.difference_update(heads)
            return {h: self._peak(jobs[h]) for h in heads}

        def reuse(head: int, k: int) -> None:
            rk, hk, kk = _key_of(reducers[k]), job_key(jobs[head]), job_key(jobs[k])
            self._values[(kk, rk)] = self._values[(hk, rk)]
            for r in self._also_for(jobs[k]):    # the replay answered them for this job too
                if (hk, ak := _key_of(r)) in self._values:
                    self._values.setdefault((kk, ak), self._values[(hk, ak)])
            if hk in self._memo:
                self._memo.setdefault(kk, self._memo[hk])
            else:
                self._reduced.setdefault(kk, self._reduced[hk])
            left.discard(k)

        _shared_rounds(jobs, one_round, reuse)
        return [self._values[(job_key(j), _key_of(r))] for j, r in zip(jobs, reducers)]

    def _values_of(self, pairs: list[tuple[Job, Any]], workers: int | None) -> list:
        """reducer(tables of job's replay) for each (job, reducer): memoized; a job replayed in
        full already is reduced from its tables here; the others are replayed once each, in
        summary mode on the pool, with every reducer asked of them."""
        need: dict[str, tuple[Job, dict[str, Any]]] = {}
        for job, r in pairs:
            jk, rk = job_key(job), _key_of(r)
            if (jk, rk) in self._values:
                continue
            if jk in self._memo:
                self._values[(jk, rk)] = r(self._memo[jk].tables())
            else:
                need.setdefault(jk, (job, {}))[1][rk] = r
        if self.keep_tables and need:
            runs = self.run([job for job, _ in need.values()], workers=workers)
            for (jk, (_, rs)), run in zip(need.items(), runs):
                tables = run.tables()
                for rk, r in rs.items():
                    self._values[(jk, rk)] = r(tables)
            return [self._values[(job_key(j), _key_of(r))] for j, r in pairs]
        for job, rs in need.values():             # tables are kept above: asked when needed
            for r in self._also_for(job):
                rs.setdefault(_key_of(r), _ahead(r))
        progress = _PROGRESS.get()
        if progress is not None and need:
            progress.planned(len(need))

        def finished(jk: str, red: Reduced) -> None:
            self._reduced[jk] = red
            self.replays_made += 1
            self._summarized.setdefault(jk, []).append(red.run["label"])
            for rk, value in zip(need[jk][1], red.values):
                if not isinstance(value, Unanswered):
                    self._values[(jk, rk)] = value
            if progress is not None:
                progress.replayed(red.run["label"])

        calls = [(jk, (job, tuple(rs.values()), _union([_spec_of(r) for r in rs.values()])))
                 for jk, (job, rs) in need.items()]
        execute(_reduce, calls, workers=workers or self.workers, on_result=finished)
        return [self._values[(job_key(j), _key_of(r))] for j, r in pairs]

    def _also_for(self, job: Job) -> list[Reducer]:
        """The reducers `asking_too` adds to a summary replay of `job`."""
        return [r for r, when in self._asking_too if when(job)]

    def _peak(self, job: Job) -> int:
        jk = job_key(job)
        return _peak_running(self._memo[jk]) if jk in self._memo else self._reduced[jk].peak_running

    def remember(self, job: Job, run: RunResult) -> None:
        """Record `run` as the replay of `job` too (a run that provably replays identically,
        e.g. a larger max_num_seqs that the smaller one never reached)."""
        self._memo.setdefault(job_key(job), run)

    @property
    def runs(self) -> list[RunResult]:
        return list({r.run_id: r for r in self._memo.values()}.values())

    @property
    def reduced(self) -> list[dict]:
        """The `runs` rows of the summary replays made for `map` (no tables were kept)."""
        return list({r.run["run_id"]: r.run for r in self._reduced.values()}.values())

    @property
    def num_distinct_runs(self) -> int:
        """Distinct run ids among the replays made, in full or in summary (a search's replay
        replayed in full afterwards under the same config, the recommended flags, is one)."""
        return len({r.run_id for r in self._memo.values()}
                   | {r.run["run_id"] for r in self._reduced.values()})

    @property
    def repeated(self) -> list[str]:
        """The labels of the jobs replayed in summary mode more than once (each job's labels
        joined by " / "): work a search could have asked for up front. Empty on the plan."""
        return [" / ".join(labels) for labels in self._summarized.values() if len(labels) > 1]


class _Tally:
    """Counts the planner's full replays, passing each on to the progress display."""

    def __init__(self, planner: Planner, progress: Progress | None) -> None:
        self.planner, self.progress = planner, progress

    def planned(self, n: int) -> None:
        if self.progress is not None:
            self.progress.planned(n)

    def replayed(self, label: str) -> None:
        self.planner.replays_made += 1
        if self.progress is not None:
            self.progress.replayed(label)


def _per_job(reduce, n: int) -> list:
    if isinstance(reduce, (list, tuple)):
        if len(reduce) != n:
            raise ValueError(f"reduce: {len(reduce)} reducers for {n} jobs")
        return list(reduce)
    return [reduce] * n


def _shared_rounds(jobs: Sequence[Job], one_round: Callable[[list[int]], dict[int, int]],
                   reuse: Callable[[int, int], None]) -> None:
    """run_shared's schedule: per group (same replay up to max_num_seqs), smallest max_num_seqs
    first; a head that never filled its max_num_seqs (peak num_running below it) stands for
    every larger value of its group (`reuse(head, k)`), else the next smallest runs."""
    groups: dict[str, list[int]] = {}
    for i, j in enumerate(jobs):
        groups.setdefault(_group_key(j), []).append(i)
    pending = {g: sorted(ix, key=lambda i: jobs[i].config.max_num_seqs or 0)
               for g, ix in groups.items()}
    while pending:
        heads = {g: ix[0] for g, ix in pending.items()}
        peaks = one_round(list(heads.values()))
        left = {}
        for g, i in heads.items():
            rest = pending[g][1:]
            if rest and peaks[i] < _max_num_seqs(jobs[i]):
                for k in rest:
                    reuse(i, k)
                rest = []
            if rest:
                left[g] = rest
        pending = left


def _max_num_seqs(job: Job) -> int:
    from replay.config import resolve
    return resolve(job.config).spec.max_num_seqs


def _peak_running(run: RunResult) -> int:
    return int(run.steps["num_running"].max() or 0) if run.steps.height else 0


def _group_key(job: Job) -> str:
    """Same key <=> same replay up to max_num_seqs (and max_num_seqs set explicitly)."""
    if job.config.max_num_seqs is None:
        return job_key(job)
    return job_key(dataclasses.replace(job, config=dataclasses.replace(job.config, max_num_seqs=1)))
