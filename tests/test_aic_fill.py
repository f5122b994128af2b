"""tools/aic_source.py `fill_grid`: how the shipped profiles fill the attention cells NVIDIA
AIConfigurator's database lacks (it ran out of memory at large batch x length). docs/timing.md,
"Interpolation choices", has the held-out errors that chose the rule."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from aic_source import fill_grid  # noqa: E402


def test_a_missing_cell_extends_its_columns_last_segment():
    """H100 TP8 Qwen3-32B (fp8 KV) at 8k context: 44.3 and 68.2 us at batch 32 and 64; batch 256
    is affine from there (a fixed cost plus the KV read), not 4 x 68.2 (the fixed cost scaled)."""
    cells = {(32, 8192): 44.3, (64, 8192): 68.2}
    grid, filled = fill_grid(cells, [32, 64, 256], [8192])
    assert filled == 1
    assert grid[2][0] == pytest.approx(68.2 + (68.2 - 44.3) * (256 - 64) / (64 - 32))
    # Interpolated at the measured batch 128 (112.7 us) it is within 3 %; the proportional fill
    # (272.8) put it at 136 us.
    assert 68.2 + (grid[2][0] - 68.2) * 64 / 192 == pytest.approx(112.7, rel=0.03)


def test_a_segment_steeper_than_proportional_is_capped():
    """A segment through a negative fixed cost is noise: the fill is never above batch-proportional."""
    cells = {(32, 4096): 189.7, (64, 4096): 419.9}          # A100 TP2 Llama-3.1-8B: 2.2x for 2x
    grid, _ = fill_grid(cells, [32, 64, 256], [4096])
    assert grid[2][0] == pytest.approx(419.9 * 256 / 64)


def test_one_smaller_batch_scales_in_proportion_and_none_scales_the_row():
    cells = {(8, 16): 2.0, (16, 16): 3.0, (16, 32): 5.0}
    grid, filled = fill_grid(cells, [8, 16], [16, 32])
    assert filled == 1                                       # (8, 32): no smaller batch there
    assert grid[0][1] == pytest.approx(2.0 * 32 / 16)        # from its row, linear in length
    grid, _ = fill_grid({(8, 16): 2.0, (8, 32): 4.0, (16, 16): 3.0}, [8, 16], [16, 32])
    assert grid[1][1] == pytest.approx(4.0 * 16 / 8)         # one smaller batch: proportional


def test_a_measured_cell_is_kept_and_a_cell_with_nothing_to_fill_from_is_refused():
    grid, filled = fill_grid({(1, 2): 7.0}, [1], [2])
    assert (grid, filled) == ([[7.0]], 0)
    with pytest.raises(LookupError, match=r"\(1, 2\)"):
        fill_grid({(1, 4): 7.0}, [1], [2, 4])
