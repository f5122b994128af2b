"""Issue 13, item 5: random mutations of a valid file of every trace format give either a valid
canonical trace or one clean line (a `TraceError`), never a parser traceback and never a hang.

The default run keeps the example count modest (KVCAP_FUZZ_EXAMPLES raises it); the long run of
1,000 mutations per format is `python -m tests.trace_mutations 1000`.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.trace_mutations import OPS, PAYLOADS, SEEDS, check_outcome, mutate

EXAMPLES = int(os.environ.get("KVCAP_FUZZ_EXAMPLES", "40"))

op = st.tuples(st.sampled_from(OPS), st.integers(0, 1 << 16), st.sampled_from(PAYLOADS))


@pytest.mark.parametrize("name", list(SEEDS))
@settings(max_examples=EXAMPLES, deadline=20_000, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=4))
def test_mutated_trace_loads_or_fails_in_one_line(name, ops):
    suffix, data = SEEDS[name]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"trace{suffix}"
        path.write_bytes(mutate(data, ops))
        assert check_outcome(path) in ("ok", "error")


@pytest.mark.parametrize("name", list(SEEDS))
def test_unmutated_seed_is_valid(name):
    """The seeds themselves load (else the fuzz test would only ever see errors)."""
    suffix, data = SEEDS[name]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"trace{suffix}"
        path.write_bytes(data)
        assert check_outcome(path) == "ok"
