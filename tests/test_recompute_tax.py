"""The recompute tax (issue 32 item 4): the prefill tokens preemption made the engine compute
again. Per request (`requests.recomputed_tokens`, both V1 implementations): the tokens scheduled
at positions the request had computed before a preemption; a prefix-cache hit or a CPU load at
the resume brings positions back without computing them, so they are not counted. Per run
(`replay.results.tables.recompute_tax`, `RunResult.recompute_tax`, a summary replay's too): recomputed /
all prefill tokens computed (`steps.num_prefill_tokens`, re-prefills included).

Checked here against an independent count from the recorded batches (every chunk [c, c+n) and
every preemption), equal on both implementations, 0 without preemption, and on golden cases."""
from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_helpers import run_compiled, run_reference
from replay.engine.v1 import V1Scheduler
from replay.results.tables import recompute_tax
from replay_helpers import tiny_spec
from test_replay_loop import workloads
from test_v1_034 import bursts
from tests.oracle_driver import drive, load

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def recount(raw) -> np.ndarray:
    """recomputed_tokens from the batches and the preemption events alone: a chunk's positions
    below the furthest the request had computed when it was last preempted."""
    n = raw.state.n
    upto, furthest, got = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    b, ev = raw.batches, raw.events
    pre: dict[int, list[int]] = {}
    for step, row, kind in zip(ev["step"], ev["row"], ev["kind"]):
        if kind.startswith("preempt_"):
            pre.setdefault(int(step), []).append(int(row))
    last = -1
    for step, row, c, m in zip(b["step"].tolist(), b["row"].tolist(),
                               b["num_computed_tokens"].tolist(), b["num_new_tokens"].tolist()):
        for s in range(last + 1, step + 1):    # preemptions up to this step come first
            for r in pre.get(s, ()):
                upto[r] = furthest[r]
        last = max(last, step)
        got[row] += max(0, min(c + m, upto[row]) - c)
        furthest[row] = max(furthest[row], c + m)
    return got


def tax(raw) -> float | None:
    return recompute_tax(pl.DataFrame({"recomputed_tokens": raw.state.recomputed_tokens}),
                         pl.DataFrame({"num_prefill_tokens": raw.steps["num_prefill_tokens"]}))


@st.composite
def specs(draw):
    kw = dict(num_gpu_blocks=draw(st.integers(6, 24)), max_num_seqs=draw(st.integers(1, 6)),
              enable_prefix_caching=draw(st.booleans()),
              policy=draw(st.sampled_from(["fcfs", "priority"])),
              max_num_batched_tokens=draw(st.sampled_from([64, 16])),
              long_prefill_token_threshold=draw(st.sampled_from([0, 5])),
              async_scheduling=draw(st.booleans()))
    if draw(st.booleans()):
        kw.update(kv_offloading=True, num_cpu_blocks=draw(st.sampled_from([2, 16])),
                  offload_transfer_steps=1)
    return tiny_spec(**kw)


@SETTINGS
@given(w=st.one_of(workloads(), bursts()), spec=specs())
def test_the_tax_is_what_the_batches_say_on_both_implementations(w, spec):
    arrival, prompt, output, prio, hashes = w
    runs = [f(spec=spec, engine="v1", arrival=arrival, prompt=prompt, output=output,
              hashes=hashes, priority=prio, record_batches=True)
            for f in (run_reference, run_compiled)]
    for raw in runs:
        np.testing.assert_array_equal(raw.state.recomputed_tokens, recount(raw))
        if raw.state.num_preemptions.sum() == 0:
            assert raw.state.recomputed_tokens.sum() == 0 and tax(raw) in (0.0, None)
        else:
            assert np.all(raw.state.recomputed_tokens >= 0)
    assert tax(runs[0]) == tax(runs[1])


def test_o1_recomputes_only_what_the_cpu_tier_did_not_hold():
    """O1: B is preempted at step 6 holding 12 computed tokens (its 8-token prompt and 4
    outputs; the 5th output is sampled, not computed). At step 15 it loads its prompt from the
    CPU tier, and at step 16 it schedules 5 tokens: the 4 outputs again (F2: only prompts are
    stored) and the sampled one for the first time."""
    sc, _ = load("O1")
    counters = {}
    drive(V1Scheduler, sc, "v1", inspect=lambda st_, ids: counters.update(
        {rid: (int(st_.recomputed_tokens[i]), int(st_.computed_at_preemption[i]))
         for i, rid in enumerate(ids)}))
    assert counters["B"] == (4, 12) and counters["A"][0] == 0


def test_a_prefix_hit_at_the_resume_is_not_recomputed():
    """S14: Low is preempted with 31 tokens computed and resumes on 32 known tokens with a
    16-token prefix hit: it schedules 16, of which 15 again (the last is its sampled token)."""
    sc, _ = load("S14")
    counters = {}
    drive(V1Scheduler, sc, "v1", inspect=lambda st_, ids: counters.update(
        {rid: int(st_.recomputed_tokens[i]) for i, rid in enumerate(ids)}))
    assert counters["Low"] == 15


def test_no_prefill_no_tax():
    assert recompute_tax(pl.DataFrame({"recomputed_tokens": [0]}),
                         pl.DataFrame({"num_prefill_tokens": [0]})) is None
    assert recompute_tax(pl.DataFrame({"recomputed_tokens": [3, 1]}),
                         pl.DataFrame({"num_prefill_tokens": [10, 6]})) == 0.25


def test_a_replay_reports_the_tax_from_its_tables_and_from_its_summary():
    """`RunResult.recompute_tax` on the Azure conv head in a small pool: the same from the full
    tables (both implementations) and from a summary replay; 0 in a pool large enough to never
    preempt."""
    import pytest

    from capacity_helpers import CONV
    from replay.config import EngineConfig
    from replay.run import replay
    from replay.results.summary import SummarySpec
    from traces.loaders import load_trace

    trace = load_trace(CONV).head(400)
    small = EngineConfig(num_gpu_blocks_override=300, max_num_seqs=64)
    full = replay(trace, small, implementation="compiled")
    ref = replay(trace, small, implementation="reference")
    lean = replay(trace, small, summary=SummarySpec())
    assert full.requests["num_preemptions"].sum() > 0
    assert 0 < full.recompute_tax < 1
    assert full.recompute_tax == ref.recompute_tax == lean.recompute_tax
    assert full.recompute_tax == pytest.approx(
        full.requests["recomputed_tokens"].sum() / full.steps["num_prefill_tokens"].sum())
    roomy = replay(trace, EngineConfig(), summary=SummarySpec())
    assert roomy.requests["num_preemptions"].sum() == 0 and roomy.recompute_tax == 0.0
