"""The OffloadingConnector's `store_threshold` (kv_connector_extra_config; oracle O1_threshold):
the CPU manager counts offers of a key (`_record_accesses` in `prepare_store`) and stores a chunk
only from its N-th offer on, keeping counts for at most `max_tracker_size` keys. vLLM 0.33 counts
every offer; 0.34 each key once per request (`counted_keys`: a preempted request's re-offer, or a
retried failed store, moves the key to the recent end without counting). The tracker's order and
its full-tracker rule, step by step; the compiled core follows it through the differential tests
(tests/test_v1_core.py and test_v1_034.py draw small trackers)."""
from __future__ import annotations

from replay.engine.v1.cpu_tier import Access, CpuTier, OfferCounts


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


def test_034_counts_each_key_once_per_request():
    c = OfferCounts(threshold=2, max_keys=3)
    counted: set[int] = set()
    assert c.offer([1, 2], counted) == [False, False]
    counted.update([1, 2])
    # The same request again: tracked keys move to the recent end without counting.
    assert c.offer([2, 1], counted) == [False, False]
    assert list(c.counts.items()) == [(2, 1), (1, 1)]
    # Another request's offer counts.
    assert c.offer([1], set()) == [True]
    # A counted key the tracker dropped is tracked again at 1, even for the request that
    # counted it (vLLM's second loop does not look at counted_keys).
    assert c.offer([3, 4], set()) == [False, False]
    assert list(c.counts.items()) == [(1, 2), (3, 1), (4, 1)]
    assert c.offer([2], counted) == [False]
    assert list(c.counts.items()) == [(3, 1), (4, 1), (2, 1)]


def test_034_ready_chunks_are_reused_whatever_their_count():
    """The threshold holds back new chunks only: a ready chunk in the offer counts as reused
    (recorded, protected) even when the tracker dropped its count (vLLM 0.33 and 0.34 alike)."""
    tier = CpuTier(capacity=2, policy="lru", store_threshold=2, tracker_size=1)
    a, b = Access(), Access()
    assert tier.prepare_store(a, [10], [0]) == ([], [])           # first offer: held back
    assert tier.prepare_store(b, [10], [0]) == ([10], [])         # second: stored
    tier.complete_store([10])
    assert tier.prepare_store(a, [11], [1]) == ([], [])           # the tracker drops 10
    assert 10 not in tier.offers.counts
    c = Access()
    assert tier.prepare_store(c, [10, 12], [0, 1]) == ([], [])
    assert 10 in c.reused and 10 in c.seen and 12 not in c.seen
