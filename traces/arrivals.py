"""Synthetic arrival times for a lengths-only trace (`--arrivals poisson:RATE`, `gamma:RATE:CV`).

Vidur's arxiv-summarization and BWB traces (and any file of prompt and output lengths) say what
each request asks for but not when it arrives. `Arrivals` gives the n requests of such a file, in
file order, the arrival times of a renewal process: exponential gaps (Poisson, cv = 1) or gamma
gaps of a given coefficient of variation (cv > 1 is burstier), the first request at 0 s. Seeded:
the same spec and seed give the same times, in and across processes (numpy's PCG64 from a
SeedSequence, as traces.synth). Must not import replay/ or capacity/.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from traces.schema import TraceError

PROCESSES = ("poisson", "gamma")
FLAG = "--arrivals"
HOW = "poisson:RATE or gamma:RATE:CV (RATE in req/s, CV the gaps' coefficient of variation)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrivals:
    process: str          # "poisson" | "gamma"
    rate_rps: float       # mean arrival rate
    cv: float = 1.0       # coefficient of variation of the gaps (poisson: 1)
    seed: int = 0

    @property
    def spec(self) -> str:
        """As the flag spells it: 'poisson:5', 'gamma:5:3'."""
        text = f"{self.process}:{self.rate_rps:g}"
        return text + (f":{self.cv:g}" if self.process == "gamma" else "")

    def __str__(self) -> str:
        return f"{self.spec} seed {self.seed}"

    def times(self, n: int) -> np.ndarray:
        """Arrival times (s) of n requests: 0, then cumulative gaps."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed)))
        if n <= 1:
            return np.zeros(max(n, 0))
        if self.process == "poisson":
            gaps = rng.exponential(1.0 / self.rate_rps, n - 1)
        else:
            shape = 1.0 / self.cv ** 2
            gaps = rng.gamma(shape, 1.0 / (self.rate_rps * shape), n - 1)
        return np.concatenate(([0.0], np.cumsum(gaps)))


def parse_arrivals(text: str, seed: int = 0) -> Arrivals:
    """`poisson:RATE` or `gamma:RATE:CV` -> Arrivals; a one-line TraceError naming the flag."""
    parts = [p.strip() for p in str(text).split(":")]
    process, numbers = parts[0].lower(), parts[1:]
    want = {"poisson": 1, "gamma": 2}.get(process)
    if want is None or len(numbers) != want:
        raise TraceError(f"{FLAG} {text!r}: expected {HOW}, e.g. {FLAG} poisson:5")
    try:
        values = [float(x) for x in numbers]
    except ValueError:
        raise TraceError(f"{FLAG} {text!r}: {', '.join(numbers)} must be numbers; expected {HOW}") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        what = "RATE and CV must be finite numbers" if want == 2 else "RATE must be a finite number"
        raise TraceError(f"{FLAG} {text!r}: {what} > 0 (req/s)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise TraceError(f"--seed {seed!r}: must be a whole number >= 0")
    return Arrivals(process=process, rate_rps=values[0], cv=values[1] if want == 2 else 1.0,
                    seed=seed)
