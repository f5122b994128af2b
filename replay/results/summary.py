"""A replay that keeps summaries of its per-step columns instead of the columns (issue 36).

A search (headroom, tuning, offload, fleet) replays a trace many times and asks each replay a few
numbers; the `steps` and `tbt` tables of a day of traffic are millions of rows each. A summary
replay hands the compiled core's step and TBT columns, chunk by chunk as they leave the core, to
`StepStats` and drops them; the run's `steps` and `tbt` are then `StepSummary` and `TbtSummary`,
which answer exactly what the analyses ask of a searched replay (capacity/analyses/metrics.py
`summary`, criteria.py `evaluate`, classify.py `classify`):
- per step column: its max, and its sum for integer columns (`steps[name].max()/.sum()`, as on a
  DataFrame), the number of steps (`height`), the end of the last step (`end_s`); so the
  recompute tax (replay/results/tables.py `recompute_tax`: recomputed / `num_prefill_tokens` summed)
  is a summary replay's too (`RunResult.recompute_tax`);
- per `window_s` of SummarySpec.windows_s: the nearest-rank P99 of the decode steps' durations
  weighted by their decode tokens, per window of step start times (classify.windows). Steps come
  in start order, so a window is complete when the next one starts: memory is one window's steps;
- TBT quantiles (SummarySpec.tbt_quantiles), exact nearest-rank over every output token: a high
  quantile (>= TAIL_Q) from the largest samples only — the run can sample at most `max_weight`
  tokens (one TBT per output token after the first), so the samples above the (1 - q) share of
  that weight can be dropped as they come; a lower one (the median) from the samples spilled to
  a file (`replay.engine.raw.ColumnSpill`) and narrowed down in passes
  (replay/results/quantiles.py).
Anything else (a row, a float sum) is not there: AttributeError or KeyError, never a guess.
Memory: the requests and one window of steps, not the number of steps.
Must not import capacity/, duckdb or torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from replay.engine.raw import STEP_COLUMNS, TBT_COLUMNS, ColumnSpill
from replay.results.quantiles import nearest_rank, nearest_rank_chunked

# Quantiles at or above this are kept exactly from the largest samples (in memory); lower ones
# need every sample (a spill file).
TAIL_Q = 0.9
# Samples a spilled median's last pass sorts at most (16 B each).
SPILL_SORT_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class SummarySpec:
    """What a summary replay keeps besides every step column's max and sum."""
    tbt_quantiles: tuple[float, ...] = (0.5, 0.99)
    windows_s: tuple[float, ...] = (60.0,)        # classify's window (capacity/analyses/classify.py)


@dataclass(frozen=True, slots=True)
class StatColumn:
    """One step column's streamed max and (integer columns) sum; `cast` keeps the DataFrame
    idiom `steps[name].cast(pl.Int64).sum()` working."""
    name: str
    maximum: int | float | None
    total: int | None

    def max(self):
        return self.maximum

    def sum(self):
        if self.total is None:
            raise KeyError(f"a summary replay keeps no sum of the float column {self.name!r}")
        return self.total

    def cast(self, _dtype) -> "StatColumn":
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary:
    """Stands in for a summary replay's `steps` table (see the module docstring)."""
    height: int
    end_s: float | None                          # max(start_s + duration_s)
    stats: dict[str, StatColumn]
    window_tbt_p99: dict[float, dict[int, float]]   # window_s -> {window: decode P99}

    @property
    def columns(self) -> list[str]:
        return list(self.stats)

    def __getitem__(self, name: str) -> StatColumn:
        return self.stats[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class TbtSummary:
    """Stands in for a summary replay's `tbt` table: its exact quantiles."""
    height: int                                   # samples
    total_weight: int                             # TBT samples (tokens)
    values: dict[float, float | None] = field(default_factory=dict)

    def quantiles(self, qs) -> list[float | None]:
        missing = [q for q in qs if q not in self.values]
        if missing:
            raise KeyError(f"this summary replay kept TBT quantiles {sorted(self.values)}, not "
                           f"{missing}: ask for them in its SummarySpec(tbt_quantiles=...)")
        return [self.values[q] for q in qs]


class _Windows:
    """Per-window weighted P99 of decode steps, closed as the next window starts."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.p99: dict[int, float] = {}
        self.w: int | None = None
        self.d: list[np.ndarray] = []
        self.k: list[np.ndarray] = []

    def add(self, start: np.ndarray, dur: np.ndarray, decode: np.ndarray) -> None:
        m = decode > 0
        if not m.any():
            return
        start, dur, decode = start[m], dur[m], decode[m]
        # The very expression classify.windows applies (float floor division differs between
        # polars and numpy at the edges).
        w = pl.DataFrame({"start_s": start}).select(
            (pl.col("start_s") // self.window_s).cast(pl.Int64))["start_s"].to_numpy()
        cut = np.flatnonzero(w[1:] != w[:-1]) + 1
        lo = 0
        for hi in [*cut.tolist(), len(w)]:
            if self.w is not None and self.w != int(w[lo]):
                self._close()
            self.w = int(w[lo])
            self.d.append(dur[lo:hi])
            self.k.append(decode[lo:hi])
            lo = hi

    def _close(self) -> None:
        self.p99[self.w] = nearest_rank(np.concatenate(self.d), 0.99, np.concatenate(self.k))
        self.d, self.k = [], []

    def finish(self) -> dict[int, float]:
        if self.w is not None:
            self._close()
            self.w = None
        return self.p99


class _TopWeight:
    """The largest TBT samples holding at least `keep` of the weight (ties at the edge kept in
    any order: equal values are interchangeable for a quantile)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.full = False              # the kept samples hold `keep` of the weight
        self.v = np.zeros(0)
        self.w = np.zeros(0, np.int64)

    def add(self, v: np.ndarray, w: np.ndarray) -> None:
        take = w > 0                   # a zero weight is never a quantile (searchsorted "left")
        if self.full:                  # below the smallest kept: never among the largest
            take &= v >= self.v[-1]
        v, w = np.concatenate([self.v, v[take]]), np.concatenate([self.w, w[take]])
        if int(w.sum()) > self.keep:
            order = np.argsort(v)[::-1]
            cw = np.cumsum(w[order])
            order = order[:int(np.searchsorted(cw, self.keep, "left")) + 1]
            v, w = v[order], w[order]          # largest first: v[-1] is the smallest kept
            self.full = True
        self.v, self.w = v, w

    def quantile(self, q: float, total: int) -> float | None:
        if total == 0:
            return None
        k = max(1, math.ceil(q * total))
        below = total - int(self.w.sum())
        if k <= below:
            raise AssertionError(f"TBT top samples hold too little weight for q={q}: kept "
                                 f"{int(self.w.sum())} of {total} (bound {self.keep})")
        order = np.argsort(self.v)
        cw = below + np.cumsum(self.w[order])
        return float(self.v[order[np.searchsorted(cw, k, "left")]])


def tail_weight(q: float, max_weight: int) -> int:
    """Weight of the largest samples that decides the q-quantile of any total up to
    `max_weight` (total - ceil(q * total) + 1 never decreases as the total grows)."""
    return max_weight - max(1, math.ceil(q * max_weight)) + 1 if max_weight else 0


class StepStats:
    """The sink a summary replay hands its step and TBT columns to (`append`, in step order);
    `finish` gives the `steps` and `tbt` stand-ins. `max_weight`: the most TBT samples the run
    can make (sum over requests of output tokens - 1)."""

    def __init__(self, spec: SummarySpec, *, max_weight: int, spill_dir: str | None = None) -> None:
        self.spec, self.max_weight = spec, max_weight
        self.n = 0
        self.samples = 0
        self.weight = 0
        self.max: dict[str, int | float | None] = {k: None for k in STEP_COLUMNS}
        self.sum: dict[str, int | None] = {k: (0 if np.dtype(t).kind == "i" else None)
                                           for k, t in STEP_COLUMNS.items()}
        self.end_s: float | None = None
        self.windows = [_Windows(w) for w in spec.windows_s]
        tail = [q for q in spec.tbt_quantiles if q >= TAIL_Q]
        self.top = _TopWeight(tail_weight(min(tail), max_weight)) if tail else None
        low = [q for q in spec.tbt_quantiles if q < TAIL_Q]
        self.spill = ColumnSpill(TBT_COLUMNS, spill_dir) if low else None

    def append(self, steps: dict[str, np.ndarray], tbt: dict[str, np.ndarray]) -> None:
        n = len(steps["start_s"])
        if n:
            self.n += n
            for k, col in steps.items():
                m = col.max().item()
                self.max[k] = m if self.max[k] is None else max(self.max[k], m)
                if self.sum[k] is not None:
                    self.sum[k] += int(col.sum(dtype=np.int64))
            end = float((steps["start_s"] + steps["duration_s"]).max())
            self.end_s = end if self.end_s is None else max(self.end_s, end)
            for w in self.windows:
                w.add(steps["start_s"], steps["duration_s"], steps["num_decode_tokens"])
        v, wt = tbt["tbt_s"], tbt["weight"]
        self.samples += len(v)
        self.weight += int(wt.sum(dtype=np.int64))
        if self.top is not None:
            self.top.add(v, wt)
        if self.spill is not None and len(v):
            self.spill.append({"tbt_s": v, "weight": wt})

    def finish(self) -> tuple[StepSummary, TbtSummary]:
        if self.weight > self.max_weight:
            raise AssertionError(f"the replay sampled {self.weight} TBTs, more than the "
                                 f"{self.max_weight} output tokens after the first allow")
        values: dict[float, float | None] = {}
        for q in self.spec.tbt_quantiles:
            if q >= TAIL_Q:
                values[q] = self.top.quantile(q, self.weight)
            else:
                spill = self.spill
                values[q] = nearest_rank_chunked(
                    lambda: ((c["tbt_s"], c["weight"]) for c in spill.chunks()), q,
                    limit=SPILL_SORT_LIMIT)
        if self.spill is not None:
            self.spill.close()
        stats = {k: StatColumn(k, self.max[k], self.sum[k]) for k in STEP_COLUMNS}
        steps = StepSummary(height=self.n, end_s=self.end_s, stats=stats,
                            window_tbt_p99={w.window_s: w.finish() for w in self.windows})
        return steps, TbtSummary(height=self.samples, total_weight=self.weight, values=values)


def max_tbt_weight(output_len: np.ndarray) -> int:
    """The most TBT samples a run of these requests can make: one per output token after the
    first (a cut at max_model_len or an abort makes fewer)."""
    return int(np.maximum(output_len.astype(np.int64) - 1, 0).sum())
