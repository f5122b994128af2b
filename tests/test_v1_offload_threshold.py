"""The OffloadingConnector's `store_threshold` (kv_connector_extra_config; oracle O1_threshold):
vLLM 0.33's CPU manager counts every offer of a key (`_record_accesses` in `prepare_store`) and
stores a chunk only from its N-th offer on, keeping counts for at most `max_tracker_size` keys.
The tracker's order and its full-tracker rule, step by step; the compiled core follows it through
the differential tests (tests/test_v1_core.py draws small trackers). 0.34's rule (each key counted
once per request) is not modelled: both implementations refuse it."""
from __future__ import annotations

import numpy as np
import pytest

from core_helpers import make_engine
from replay import compiled
from replay.v1 import V1Scheduler
from replay.v1.cpu_tier import CpuTier, OfferCounts
from replay_helpers import tiny_spec


def test_offers_are_counted_and_the_tracker_drops_the_least_recently_offered():
    c = OfferCounts(threshold=2, max_keys=3)
    assert c.offer([1, 2]) == [False, False]
    # Tracked keys count again first (2 -> 2), new ones start at 1.
    assert c.offer([2, 3]) == [True, False]
    assert list(c.counts.items()) == [(1, 1), (2, 2), (3, 1)]
    # Full: 1 counts again and moves to the end, then 4 drops the oldest key outside the offer (2).
    assert c.offer([4, 1]) == [False, True]
    assert list(c.counts.items()) == [(3, 1), (1, 2), (4, 1)]
    # 3 and 1 count again; 5 drops 4, the only key outside the offer; 6 finds every tracked key
    # in the offer and is not tracked at all.
    assert c.offer([5, 6, 3, 1]) == [False, False, True, True]
    assert list(c.counts.items()) == [(3, 2), (1, 3), (5, 1)]
    assert c.offer([6]) == [False]
    assert list(c.counts.items()) == [(1, 3), (5, 1), (6, 1)]
    # The same request offering a key again counts again (0.33: O1_threshold's preempted B).
    assert c.offer([6]) == [True]


def test_below_two_nothing_is_counted():
    for thr in (0, 1):
        assert CpuTier(capacity=4, policy="lru", store_threshold=thr).offers is None


@pytest.mark.parametrize("impl", ["reference", "compiled"])
def test_per_request_counting_is_refused(impl):
    spec = tiny_spec(kv_offloading=True, num_cpu_blocks=4, offload_transfer_steps=1,
                     offload_store_threshold=2,
                     offload_store_counting="once_per_request")
    state, keys, ex = make_engine("v1", spec, [0.0], np.array([8]), np.array([2]), None)
    if impl == "reference":
        with pytest.raises(NotImplementedError, match="offload_store_counting"):
            V1Scheduler(spec, state, keys)
    else:
        outs = tuple(np.zeros(1) for _ in range(4))
        with pytest.raises(ValueError, match="offload_store_counting"):
            compiled.new_core("v1", state, spec, ex, keys, outs)
