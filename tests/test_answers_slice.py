"""The default-run slice of the invariant corpus (issue 31; the whole corpus: make check-answers).

Every invariant of tests/answers/invariants.py on the corpus' slice scenarios (small, fast: a
healthy synthetic V1 trace, a KV-bound V0 one, a window of the public Azure conv trace), each
scenario's commands run once into a pytest temp folder. Plus the corpus' coverage, checked
without running anything.
"""
import pytest

from answers import corpus, invariants
from answers.runner import ScenarioRun, merge_flags

SLICE = corpus.select(slice_only=True)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root, done = tmp_path_factory.mktemp("answers"), {}

    def get(s: corpus.Scenario):
        if s.name not in done:
            done[s.name] = ScenarioRun(s, root).run_all()
        return done[s.name]
    return get


@pytest.mark.parametrize("invariant", invariants.INVARIANTS, ids=invariants.NAMES)
@pytest.mark.parametrize("scenario", SLICE, ids=[s.name for s in SLICE])
def test_invariant_holds(scenario, invariant, outcomes):
    status, detail = invariant(scenario, outcomes(scenario))
    if status == invariants.NA:
        pytest.skip(detail)
    assert status == invariants.PASS, f"{scenario.name}: {detail}"


def test_corpus_covers_the_issue():
    ss = corpus.SCENARIOS
    assert len(ss) >= 40 and 2 <= len(SLICE) <= 3
    assert {s.regime for s in ss} == set(corpus.REGIMES)
    assert {s.scheduler for s in ss} == {"v0", "v1"}
    assert any(corpus.flag_value(s.engine, "--preemption-mode") == "swap" for s in ss)
    assert {corpus.flag_value(s.engine, "--model") or "llama-3.1-8b" for s in ss} \
        >= {"llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mistral-7b"}
    assert {corpus.flag_value(s.engine, "--tensor-parallel-size") or "1" for s in ss} \
        == {"1", "2", "4"}
    assert {s.trace.source for s in ss if s.trace.public} == set(corpus.PUBLIC)
    assert any(s.trace.has_prefix_hashes for s in ss) and any(not s.trace.has_prefix_hashes for s in ss)
    assert any(s.trace.has_priorities for s in ss)


def test_recommended_flags_override_engine_flags():
    assert merge_flags(["--scheduler", "v0", "-tp", "4", "--enable-prefix-caching"],
                       ["--no-enable-prefix-caching", "--tensor-parallel-size", "2"]) \
        == ["--scheduler", "v0", "--tensor-parallel-size", "2", "--no-enable-prefix-caching"]


def test_a_departure_the_flags_do_not_carry_fails():
    """departures_in_flags can fail: the chunked-prefill departure against flags without it, or
    on a deployment that ran chunked prefill already; and passes on the plan's own shape."""
    from answers.runner import Outcome
    s = corpus.BY_NAME["gamma-code-v0-mistral-h200-unchunked"]
    dep = {"knob": "--enable-chunked-prefill", "default": "off, --max-num-batched-tokens 32768",
           "recommended": "on, --max-num-batched-tokens 1024", "gain": 20.7, "threshold": 0.1}

    def run(flags, chunked_before=False):
        report = Outcome("report", [], rc=0, out={"departures": [dep],
                                                   "recommendation": {"flags": flags}})
        default = Outcome("replay-default", [], rc=0,
                          extra={"config": {"enable_chunked_prefill": chunked_before}})
        return invariants.departures_in_flags(s, {"report": report, "replay-default": default})[0]
    good = ["--max-num-batched-tokens", "1024", "--enable-chunked-prefill"]
    assert run(good) == invariants.PASS
    assert run(good, chunked_before=True) == invariants.FAIL
    assert run(["--max-num-batched-tokens", "2048", "--enable-chunked-prefill"]) == invariants.FAIL
    assert run(["--max-num-batched-tokens", "1024", "--no-enable-chunked-prefill"]) == invariants.FAIL
