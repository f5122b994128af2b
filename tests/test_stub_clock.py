"""The stub's step clock on CUDA, with torch.cuda's events and sleep replaced by a scripted device
(no GPU here): what it measures, when a step counts as gapless, and how the next sleep adapts."""
from __future__ import annotations

import pytest
import torch

from replay.stub import clock as clock_mod
from replay.stub.clock import StepClock


class FakeDevice:
    """A device timeline: sleeps advance it at `cycles_per_s`, work by hand; `started` is whether
    the start event has fired by the time the host asks."""

    def __init__(self, cycles_per_s: float) -> None:
        self.now, self.cycles_per_s, self.started = 0.0, cycles_per_s, False
        self.sleeps: list[int] = []

    def sleep(self, cycles: int) -> None:
        self.sleeps.append(cycles)
        self.now += cycles / self.cycles_per_s


@pytest.fixture
def device(monkeypatch):
    dev = FakeDevice(cycles_per_s=2e9)

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = None

        def record(self, stream=None) -> None:
            self.t = dev.now

        def query(self) -> bool:
            return dev.started

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: "Event") -> float:
            return (other.t - self.t) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", dev.sleep, raising=False)
    return dev


def _step(clock: StepClock, dev: FakeDevice, *, swap_s: float, rest_s: float, started: bool):
    dev.started = started
    clock.start()
    dev.now += swap_s
    clock.mark()
    dev.now += rest_s
    return clock.stop()


def test_the_clock_times_the_work_after_the_sleep_and_learns_the_clock_rate(device):
    c = StepClock(torch.device("cuda"))
    assert c.hide
    t = _step(c, device, swap_s=0.001, rest_s=0.004, started=False)
    assert t.total_s == pytest.approx(0.005) and t.swap_s == pytest.approx(0.001)
    assert t.gapless and t.enqueue_s < 0.1
    assert device.sleeps == [int(2e-3 * 1.5e9)]         # the first sleep: the default guess
    assert c.cycles_per_s == pytest.approx(2e9)          # read off that sleep
    # The next sleep covers the host's launches with a margin, at the learnt rate.
    expected = max(clock_mod._MIN_SLEEP_S, clock_mod._MARGIN * t.enqueue_s)
    assert c.sleep_s == pytest.approx(expected)
    _step(c, device, swap_s=0.0, rest_s=0.002, started=False)
    assert device.sleeps[-1] == int(expected * 2e9)


def test_a_step_whose_start_fired_before_its_last_launch_is_not_gapless_and_sleeps_grow(device):
    c = StepClock(torch.device("cuda"))
    t = _step(c, device, swap_s=0.0, rest_s=0.003, started=True)
    assert not t.gapless and t.total_s == pytest.approx(0.003)
    assert c._stretch == 1.5
    _step(c, device, swap_s=0.0, rest_s=0.003, started=True)
    assert c._stretch == 2.25
    for _ in range(20):                                  # gapless again: back down to 1
        assert _step(c, device, swap_s=0.0, rest_s=0.003, started=False).gapless
    assert c._stretch == 1.0


def test_without_hiding_there_is_no_sleep_and_no_step_is_called_gapless(device):
    c = StepClock(torch.device("cuda"), hide_launch=False)
    t = _step(c, device, swap_s=0.001, rest_s=0.002, started=False)
    assert device.sleeps == [] and not t.gapless and t.total_s == pytest.approx(0.003)


def test_on_the_cpu_the_host_time_is_the_step_time():
    c = StepClock(torch.device("cpu"))
    c.start(); c.mark()
    t = c.stop()
    assert t.gapless and t.total_s == t.enqueue_s >= t.swap_s >= 0 and not c.hide
