"""What both compiled cores share (replay/engine/compiled.py, replay/engine/kvcore.h) and engine selection
(replay/run.py `run_engine`): every field of the resolved spec is read by each core or declared
not applicable (and a field left unread fails), progress reports at step multiples, the sorted-input
check, the one-line notice when a replay runs on the reference, and the implementation recorded.
Scheduler-specific behaviour is in test_v1_core.py / test_v0_core.py."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from core_helpers import make_engine, run_compiled, run_reference
from replay.engine import compiled
from replay.engine.prefix import TokenBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.run import run_engine
from replay_helpers import tiny_spec

REPLAY = Path(__file__).resolve().parents[1] / "replay"
# Spec knobs for a tiny run each core accepts (V0: chunking off keeps its default path).
ENGINES = [pytest.param("v1", {}, id="v1"),
           pytest.param("v0", {"enable_chunked_prefill": False}, id="v0")]


def _fields_read_by_reference(engine: str) -> set[str]:
    """The spec fields the reference scheduler of `engine` reads (`spec.<name>` in its source)."""
    src = "".join(p.read_text() for p in (REPLAY / engine).glob("*.py"))
    return set(re.findall(r"\bspec\.([a-z_0-9]+)", src))


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_every_spec_field_is_read_by_the_core_or_declared_not_applicable(engine, knobs):
    """Adding a SchedulerSpec knob without teaching the core fails here (and at run time), so a
    compiled replay can never silently ignore one."""
    names = {f.name for f in fields(SchedulerSpec)}
    na = set(compiled.NOT_APPLICABLE[engine])
    assert na <= names, f"stale NOT_APPLICABLE entries {sorted(na - names)}"
    # "Not applicable" must be true of the reference too: it does not read those fields either.
    assert not na & _fields_read_by_reference(engine), sorted(na & _fields_read_by_reference(engine))
    spec = tiny_spec(**knobs)
    state, keys, ex = make_engine(engine, spec, [0.0], np.array([4]), np.array([2]), None)
    outs = tuple(np.zeros(1) for _ in range(4))
    _, left = compiled.new_core(engine, state, spec, ex, keys, outs)
    # What the core left is exactly what it declares not applicable.
    assert set(left) == na


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_a_field_the_core_does_not_read_fails(engine, knobs):
    """The demonstration the issue asks for: a spec with one more field than the core reads
    (a knob added to SchedulerSpec but not to the C side) is refused, naming the field."""
    spec = tiny_spec(**knobs)
    state, keys, ex = make_engine(engine, spec, [0.0], np.array([4]), np.array([2]), None)
    outs = tuple(np.zeros(1) for _ in range(4))
    with pytest.raises(AssertionError, match=r"does not read spec field\(s\) \['new_knob'\]"):
        compiled.new_core(engine, state, spec, ex, keys, outs,
                          fields_in={**compiled.spec_dict(spec), "new_knob": 1})


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_an_unsupported_value_names_the_field(engine, knobs):
    spec = tiny_spec(**knobs)
    state, keys, ex = make_engine(engine, spec, [0.0], np.array([4]), np.array([2]), None)
    outs = tuple(np.zeros(1) for _ in range(4))
    with pytest.raises(ValueError, match="policy = 'lottery'"):
        compiled.new_core(engine, state, spec, ex, keys, outs,
                          fields_in={**compiled.spec_dict(spec), "policy": "lottery"})


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_progress_is_reported_at_step_multiples(engine, knobs):
    rng = np.random.default_rng(0)
    n = 200
    arrival = np.cumsum(rng.exponential(0.02, n))
    prompt, output = rng.integers(5, 30, n), rng.integers(5, 30, n)
    spec = tiny_spec(num_gpu_blocks=200, max_num_seqs=16, max_model_len=64, **knobs)
    for run in (run_compiled, run_reference):
        calls = []
        raw = run(engine, spec, arrival, prompt, output,
                  on_progress=lambda t, done: calls.append((t, done)), progress_every_steps=100)
        assert len(calls) == raw.num_steps // 100
        ts = [c[0] for c in calls]
        assert ts == sorted(ts) and all(0 < d <= n for _, d in calls)
        # Each report is the end time of its 100th step.
        ends = raw.steps["start_s"] + raw.steps["duration_s"]
        assert ts[0] == ends[99]


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_selection_notice_and_recorded_implementation(engine, knobs, capsys):
    spec = tiny_spec(**knobs)
    arrival, prompt, output = [0.0, 0.1], np.array([10, 12]), np.array([5, 6])
    state, keys, ex = make_engine(engine, spec, arrival, prompt, output, None)
    raw = run_engine(engine, spec, state, keys, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    assert raw.implementation == "compiled" and capsys.readouterr().err == ""
    state, keys, ex = make_engine(engine, spec, arrival, prompt, output, None)
    ref = run_engine(engine, spec, state, keys, ex, kv_bytes_per_block=spec.kv_bytes_per_block,
                     implementation="reference")
    assert ref.implementation == "reference" and capsys.readouterr().err == ""  # asked for: quiet
    # Token-id keys (the oracle scenarios) are not handed to C: auto says so in one line.
    tokens = TokenBlockKeys(block_size=spec.block_size, tokens=lambda r: list(range(100 * r, 100 * r + 40)))
    state, _, ex = make_engine(engine, spec, arrival, prompt, output, None)
    run_engine(engine, spec, state, tokens, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "reference implementation" in err[0] and "token-id" in err[0]
    state, _, ex = make_engine(engine, spec, arrival, prompt, output, None)
    with pytest.raises(ValueError, match="cannot run this replay: .*not the cost model"):
        run_engine(engine, spec, state, tokens, object(), implementation="compiled",
                   kv_bytes_per_block=spec.kv_bytes_per_block)


def test_unavailable_reasons():
    spec = tiny_spec()
    state, keys, ex = make_engine("v1", spec, [0.0], np.array([4]), np.array([2]), None)
    assert compiled.unavailable("v1", ex, keys, state) is None
    assert "not the cost model" in compiled.unavailable("v1", object(), keys, state)
    assert "not built" in compiled.unavailable("v2", ex, keys, state)


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_core_rejects_unsorted_arrivals(engine, knobs):
    spec = tiny_spec(**knobs)
    with pytest.raises(ValueError, match="sorted by arrival_s"):
        run_compiled(engine, spec, [0.2, 0.1], np.array([4, 4]), np.array([2, 2]))


def test_runs_table_records_the_implementation(tmp_path, capsys):
    import duckdb

    from replay.config import EngineConfig
    from replay.run import replay
    from replay.results.store import write_run
    from traces.synth import synthesize
    trace = synthesize("poisson", rate_rps=5, duration_s=4)
    for impl in ("compiled", "reference"):
        # Both implementations give the same tables, hence the same run id: one file each.
        db = tmp_path / f"{impl}.duckdb"
        write_run(db, replay(trace, EngineConfig(), implementation=impl).tables())
        con = duckdb.connect(str(db), read_only=True)
        assert con.execute("SELECT implementation FROM runs").fetchall() == [(impl,)]
        con.close()


@pytest.mark.parametrize("engine,knobs", ENGINES)
def test_token_id_keys_are_precomputed_for_the_core(engine, knobs):
    """Token-id keys with the whole sequences known (the oracle's case) run compiled, with the
    prefix hits the reference finds: requests sharing a prompt prefix, and a repeated prompt."""
    from core_helpers import assert_identical
    spec = tiny_spec(enable_prefix_caching=True, **knobs)
    rng = np.random.default_rng(5)
    n = 30
    arrival = np.sort(rng.uniform(0, 0.4, n))
    prompt, output = rng.integers(6, 30, n), rng.integers(2, 20, n)
    base = list(range(1000, 1040))
    toks = [base[:8] + [5000 + 100 * r + i for i in range(int(p) - 8)] if r % 3 else base[:p]
            for r, p in enumerate(prompt)]

    def all_tokens(r):
        return toks[r] + [9_000_000 + 1000 * r + k for k in range(int(output[r]))]

    runs = []
    for impl in ("compiled", "reference"):
        state, _, ex = make_engine(engine, spec, arrival, prompt, output, None)
        keys = TokenBlockKeys(block_size=spec.block_size, all_tokens=all_tokens,
                              tokens=lambda r, st=state: all_tokens(r)[:int(st.prompt_len[r]
                                                                            + st.num_output[r])])
        runs.append(run_engine(engine, spec, state, keys, ex, implementation=impl,
                               kv_bytes_per_block=spec.kv_bytes_per_block))
    assert_identical(*runs)
    assert runs[0].state.cached_prompt_tokens.sum() > 0        # prefix hits really happened
