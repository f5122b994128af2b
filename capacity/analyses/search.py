"""The largest multiple of a trace's rate at which a predicate still holds, by bracketing and
bisection on the rate scale (docs/metrics.md, "Sustainable load and headroom").

The predicate (sustainable; or meets the SLOs and the preemption budget) is assumed monotone in the
scale. From `start`, the scale is multiplied (or divided) by `step` until the predicate flips, then
the bracket [largest passing, smallest failing] is bisected geometrically until its ends are within
`precision` of each other (hi / lo <= 1 + precision). The answer is the largest passing probe: it
was replayed and passed, so it is never an interpolation. Several searches advance in lock-step so
that each round's probes replay in parallel (`run_searches`). Probes are rounded to 4 significant
digits so that every caller probes the same scales and shares the replays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable

from capacity.units import distinct

PRECISION = 0.05
STEP = 2.0
MAX_SCALE = 8.0
MIN_SCALE = 1 / 64
MAX_PROBES = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleSearch:
    scale: float | None          # largest passing probe (None: none passed down to MIN_SCALE)
    failed_at: float | None      # smallest failing probe above it (None: passed up to MAX_SCALE)
    precision: float
    probes: tuple[tuple[float, bool], ...]

    @property
    def capped(self) -> bool:
        """True when the predicate held up to the largest scale searched."""
        return self.failed_at is None

    def words(self) -> str:
        if self.scale is None:
            return f"below ×{self.failed_at:g} (nothing passes)"
        if self.capped:
            return f"at least ×{self.scale:.2f} (the largest scale searched)"
        # Bounds a probe apart never print alike ("×0.14 (fails at ×0.14)").
        ok, failed = distinct(self.scale, self.failed_at)
        return f"×{ok} (fails at ×{failed}; precision {self.precision:.0%})"

    def as_dict(self) -> dict:
        return {"scale": self.scale, "failed_at": self.failed_at, "precision": self.precision,
                "probes": [{"rate_scale": s, "ok": ok} for s, ok in self.probes]}


def _round(x: float) -> float:
    return float(f"{x:.4g}")


@dataclass(slots=True, kw_only=True)
class _Bracket:
    start: float
    precision: float
    step: float
    guess: float | None
    max_probes: int
    lo: float | None = None
    hi: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def next(self) -> float | None:
        if len(self.probes) >= self.max_probes:
            return None
        if not self.probes:
            return _round(self.start)
        if self.lo is None:
            if self.hi <= MIN_SCALE:
                return None
            if self.guess is not None and self.guess < self.hi and len(self.probes) == 1:
                return _round(max(self.guess, MIN_SCALE))
            return _round(max(self.hi / self.step, MIN_SCALE))
        if self.hi is None:
            if self.lo >= MAX_SCALE:
                return None
            return _round(min(self.lo * self.step, MAX_SCALE))
        if self.hi / self.lo <= 1 + self.precision:
            return None
        if self.guess is not None and self.galloping:
            # The guess (a measured capacity) passed: the edge is usually just above it, so
            # step up from it by precision, 2x precision, 4x ... until a probe fails.
            up = _round(self.lo * (1 + self.precision * 2 ** (len(self.probes) - 2)))
            if up < self.hi:
                return up
        mid = _round(math.sqrt(self.lo * self.hi))
        return mid if self.lo < mid < self.hi else None

    @property
    def galloping(self) -> bool:
        """Every probe since the guess passed (the first probe, at `start`, failed)."""
        return (len(self.probes) >= 2 and not self.probes[0][1]
                and all(ok for _, ok in self.probes[1:]))

    def record(self, scale: float, ok: bool) -> None:
        self.probes.append((scale, ok))
        if ok and (self.lo is None or scale > self.lo):
            self.lo = scale
        if not ok and (self.hi is None or scale < self.hi):
            self.hi = scale
        if self.guess is not None and ok:
            # Close to a guess that passed: small steps. A guess that failed says nothing
            # about how far below the edge is: keep halving.
            self.step = 1 + 4 * self.precision

    def result(self) -> ScaleSearch:
        return ScaleSearch(scale=self.lo, failed_at=self.hi, precision=self.precision,
                           probes=tuple(sorted(self.probes)))


def run_searches(keys: list[Hashable], evaluate: Callable[[list[tuple[Hashable, float]]], list[bool]],
                 *, start: float = 1.0, guesses: dict | None = None, precision: float = PRECISION,
                 step: float = STEP, max_probes: int = MAX_PROBES) -> dict[Hashable, ScaleSearch]:
    """One search per key; `evaluate([(key, scale), ...])` replays a round's probes (in parallel)
    and returns whether each passes."""
    if not 0 < precision < 1:
        raise ValueError(f"precision: a fraction between 0 and 1, got {precision}")
    guesses = guesses or {}
    states = {k: _Bracket(start=start, precision=precision, step=step, guess=guesses.get(k),
                          max_probes=max_probes) for k in keys}
    while True:
        todo = [(k, s) for k, st in states.items() if (s := st.next()) is not None]
        if not todo:
            return {k: st.result() for k, st in states.items()}
        for (k, s), ok in zip(todo, evaluate(todo)):
            states[k].record(s, bool(ok))


def search_scale(evaluate: Callable[[float], bool], **kw) -> ScaleSearch:
    """One search; `evaluate(scale)` says whether the predicate holds at that scale."""
    return run_searches(["x"], lambda todo: [evaluate(s) for _, s in todo], **kw)["x"]
