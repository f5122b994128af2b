"""vLLM 0.34 (`SchedulerSpec.vllm_version`, oracle README §8) beyond the oracle files
(tests/test_v1_oracle.py and test_v1_offload_oracle.py replay every scenario of expected-034/):
the spec refuses 0.34's knobs on 0.33, and the compiled core equals the reference on random
workloads with 0.34's rules and knobs on (cache-aware admission, the in-flight load cap, the
store threshold counted once per request, the long-prefill cap without chunked prefill), and
either reading of equal arrival times (`arrival_ties`)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_helpers import assert_identical, run_both_with, run_compiled, run_stepped
from replay.engine.spec import SchedulerSpec
from replay.engine.state import Status
from replay_helpers import tiny_spec
from test_replay_loop import workloads

EXAMPLES = int(os.environ.get("KVCAP_CORE_EXAMPLES", 150))


@pytest.mark.parametrize("knob,value", [("cache_aware_admission_window", 4),
                                        ("cache_aware_admission_threshold", 0.7),
                                        ("max_num_inflight_kv_loads", 2)])
def test_034_knobs_are_refused_on_033(knob, value):
    with pytest.raises(ValueError, match=f"{knob}: vLLM 0.34 knob"):
        tiny_spec(**{knob: value})
    assert getattr(tiny_spec(vllm_version="0.34", **{knob: value}), knob) == value


@pytest.mark.parametrize("kw,match", [
    (dict(vllm_version="0.35"), "vllm_version"),
    (dict(vllm_version="0.34", cache_aware_admission_window=-1), "window"),
    (dict(vllm_version="0.34", cache_aware_admission_threshold=1.5), "threshold"),
    (dict(vllm_version="0.34", max_num_inflight_kv_loads=0), "max_num_inflight_kv_loads")])
def test_bad_values_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_spec(**kw)


def test_version_rules_resolve_from_the_spec():
    assert tiny_spec().store_counting == "every_offer"
    assert tiny_spec(vllm_version="0.34").store_counting == "once_per_request"
    assert tiny_spec(vllm_version="0.34",
                     offload_store_counting="every_offer").store_counting == "every_offer"
    # vLLM turns cache-aware admission off without prefix caching or under priority.
    on = dict(vllm_version="0.34", cache_aware_admission_window=4)
    assert tiny_spec(**on).cache_aware_window == 4
    assert tiny_spec(**on, enable_prefix_caching=False).cache_aware_window == 0
    assert tiny_spec(**on, policy="priority").cache_aware_window == 0
    assert SchedulerSpec.__dataclass_fields__["vllm_version"].default == "0.33"


@st.composite
def specs_034(draw):
    chunked = draw(st.booleans())
    offload = draw(st.booleans())
    kw = dict(vllm_version="0.34",
              num_gpu_blocks=draw(st.integers(6, 40)), max_num_seqs=draw(st.integers(1, 6)),
              enable_chunked_prefill=chunked, enable_prefix_caching=draw(st.booleans()),
              policy=draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
              long_prefill_token_threshold=draw(st.sampled_from([0, 5, 16])),
              async_scheduling=draw(st.booleans()),
              max_num_batched_tokens=draw(st.sampled_from([64, 24, 9] if chunked else [64])),
              cache_aware_admission_window=draw(st.sampled_from([0, 2, 4, 64])),
              cache_aware_admission_threshold=draw(st.sampled_from([0.0, 0.5, 0.9])),
              arrival_ties=draw(st.sampled_from(["trace_order", "equal"])))
    if offload:
        kw.update(kv_offloading=True, num_cpu_blocks=draw(st.sampled_from([2, 8, 24])),
                  offload_eviction_policy=draw(st.sampled_from(["lru", "arc"])),
                  offload_store_threshold=draw(st.sampled_from([0, 2, 3])),
                  offload_store_tracker_size=draw(st.sampled_from([64_000, 3])),
                  offload_transfer_steps=draw(st.sampled_from([1, 2])),
                  max_num_inflight_kv_loads=draw(st.sampled_from([None, 1, 2])))
    return tiny_spec(**kw)


@st.composite
def bursts(draw):
    """Requests in a few bursts sharing prefixes from a small alphabet (8 tokens per hash), so
    several wait at once with different GPU hits (the reorder) and CPU hits (the load cap)."""
    n = draw(st.integers(2, 16))
    arrival = np.sort(np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 0.3, 1.0, 2.5]),
                                             min_size=n, max_size=n))))
    prompt = np.array(draw(st.lists(st.integers(8, 40), min_size=n, max_size=n)))
    output = np.array(draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)))
    prio = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    hashes = [draw(st.lists(st.integers(0, 1), min_size=(p + 7) // 8, max_size=(p + 7) // 8))
              for p in prompt.tolist()]
    return arrival, prompt, output, prio, hashes


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=st.one_of(workloads(), bursts()), spec=specs_034())
def test_034_core_equals_reference(w, spec):
    arrival, prompt, output, prio, hashes = w
    fast, slow = run_both_with("v1", spec, arrival, prompt, output, hashes, prio)
    assert_identical(fast, slow)
    assert np.all(np.isin(fast.state.status, [Status.FINISHED, Status.REJECTED]))


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=bursts(), spec=specs_034())
def test_034_per_step_contract_equals_run_to_end(w, spec):
    """The core stepped through `StepCore` (which also records each cache-aware reorder) ==
    the core run to the end in C."""
    arrival, prompt, output, prio, hashes = w
    stepped = run_stepped("v1", spec, arrival, prompt, output, hashes, prio)
    fast = run_compiled("v1", spec, arrival, prompt, output, hashes, prio)
    assert_identical(stepped, fast)
