"""Work functions for the sweep tests (importable by pool and Ray workers: tests/ is on their
path). `flaky` fails the first attempt of every point (a retry then succeeds) and every attempt
of points whose label names max_num_seqs=13; attempts are counted in files under
$KVCAP_TEST_SWEEP_DIR, so they are seen across processes."""
import os
from pathlib import Path

from capacity.analyses.distributed import run_point


def flaky(point, trace):
    marks = Path(os.environ["KVCAP_TEST_SWEEP_DIR"])
    mark = marks / f"{point.run_id}.tried"
    first = not mark.exists()
    mark.write_text("x")
    if "max_num_seqs=13" in point.label:
        raise RuntimeError(f"injected failure of point {point.index}")
    if first:
        raise RuntimeError("injected first-attempt failure")
    return run_point(point, trace)
