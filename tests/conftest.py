"""Shared pytest set-up."""
# With hypothesis's pytest plugin loaded, a failing notebook crashes pytest's summary on CPython
# 3.11.7 (SystemError: AST constructor recursion depth mismatch); importing it first avoids that
# (../shared/STACK.md).
import hypothesis  # noqa: F401
from pathlib import Path

import pytest

from replay.results.dbfile import DEFAULT_DB as CLI_DEFAULT_DB

# The CLI's default --db in the checkout (many tests run kvcap there). A test that forgets --db
# would append its runs to the developer's own file, and under `make test`'s parallel workers two
# such tests would fight over the file's lock.
DEFAULT_DB = Path(__file__).resolve().parents[1] / CLI_DEFAULT_DB


def _db_state():
    try:
        st = DEFAULT_DB.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


@pytest.fixture(autouse=True)
def _leaves_the_checkouts_default_db_alone():
    before = _db_state()
    yield
    assert _db_state() == before, (
        f"the test wrote {DEFAULT_DB}: pass --db under tmp_path (with parallel workers, a test "
        "running at the same time on the other worker may be the one)")
