"""How the torch stub times a step: the device's time for the step's work, not Python's.

On a GPU the stub launches a few hundred kernels per step from Python, a few microseconds of host
time each; vLLM replays CUDA graphs instead, so its steps cost the kernels alone. Timed naively
(an event before the first launch, one after the last), a stub step would measure the host's
launch rate whenever that is slower than the kernels: the comparison with a step-time profile
would then be about Python. So `StepClock` on CUDA (`hide_launch=True`):
- enqueues a GPU sleep (`torch.cuda._sleep`) a little longer than the last step's launches took,
  then the start event: the whole step is queued while the device sleeps, and runs back to back;
- after the step's last launch asks whether the start event has fired. If not, every kernel was
  queued before the first ran, so the events measured the kernels alone: the step is *gapless*.
  If it has (a slow host, or a full launch queue made the host wait), the step may include host
  gaps: it is recorded as not gapless, and the next sleeps are longer;
- converts seconds to sleep cycles with the clock rate read off the previous sleep itself.

Without `hide_launch` (or without `torch.cuda._sleep`) CUDA events time the step as it runs; on the
CPU `time.perf_counter` does, and every step counts as gapless (host time is the device's time).

Must not import traces/, capacity/, polars or duckdb (the GPU machine has torch + numpy only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

_MIN_SLEEP_S = 2e-4          # covers the few launches of an almost empty step
_MAX_SLEEP_S = 0.2           # a host that slow is not hidden by sleeping longer
_MARGIN = 1.3                # sleep this much longer than the last step's launches took


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    total_s: float           # the step's work, start to end
    swap_s: float            # its swap copies alone (start to `mark`)
    enqueue_s: float         # host time spent launching it
    gapless: bool            # the device ran it without waiting for the host


class StepClock:
    def __init__(self, device: torch.device, *, hide_launch: bool = True) -> None:
        self.cuda = device.type == "cuda"
        self.hide = self.cuda and hide_launch and hasattr(torch.cuda, "_sleep")
        self.cycles_per_s = 1.5e9          # corrected from the first sleep on
        self.sleep_s = 2e-3
        self._stretch = 1.0                # grows while steps are not gapless

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if not self.cuda:
            return
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self._e0, self._e1, self._e2 = ev(), ev(), ev()
        if self.hide:
            self._es = ev()
            self._es.record()
            self._cycles = int(self.sleep_s * self.cycles_per_s)
            torch.cuda._sleep(self._cycles)
        self._e0.record()

    def mark(self) -> None:
        """The swap copies are enqueued (the forward pass comes next)."""
        if self.cuda:
            self._e1.record()
        else:
            self._t1 = time.perf_counter()

    def stop(self) -> StepTime:
        if not self.cuda:
            t2 = time.perf_counter()
            return StepTime(total_s=t2 - self._t0, swap_s=self._t1 - self._t0,
                            enqueue_s=t2 - self._t0, gapless=True)
        self._e2.record()
        enqueue_s = time.perf_counter() - self._t0
        gapless = self.hide and not self._e0.query()
        self._e2.synchronize()
        if self.hide:
            slept = self._es.elapsed_time(self._e0) / 1e3
            if slept > 0:
                self.cycles_per_s = self._cycles / slept
            self._stretch = max(1.0, self._stretch * 0.9) if gapless else min(4.0, self._stretch * 1.5)
            self.sleep_s = min(_MAX_SLEEP_S,
                               max(_MIN_SLEEP_S, _MARGIN * self._stretch * enqueue_s))
        return StepTime(total_s=self._e0.elapsed_time(self._e2) / 1e3,
                        swap_s=self._e0.elapsed_time(self._e1) / 1e3, enqueue_s=enqueue_s,
                        gapless=gapless)
