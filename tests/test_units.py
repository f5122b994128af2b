"""One spelling of numbers (issue 33): ms below 1 s, s above, thousands separators, no
scientific notation, and two bounds that differ never printed alike."""
import pytest

from capacity.analyses.search import ScaleSearch
from capacity.units import distinct, limit, number, seconds


@pytest.mark.parametrize("v,text", [
    (None, "-"), (0.00042, "0.42 ms"), (0.0123, "12.3 ms"), (0.173, "173 ms"), (0.9996, "1.00 s"),
    (8.771, "8.77 s"), (378.12, "378.1 s"), (1010.4, "1,010 s"), (123456.7, "123,457 s"),
])
def test_seconds(v, text):
    assert seconds(v) == text


def test_seconds_never_writes_an_exponent():
    for k in range(-7, 9):
        for m in (1.0, 2.5, 9.99):
            assert "e" not in seconds(m * 10.0 ** k).replace("ms", "").replace(" s", "")


@pytest.mark.parametrize("v,text", [(0.2, "200 ms"), (5, "5 s"), (1.5, "1.5 s"), (0.0125, "12.5 ms")])
def test_limits_read_as_written(v, text):
    assert limit(v) == text


@pytest.mark.parametrize("v,text", [(12345.6, "12,346"), (1.2345, "1.23"), (0.0000123, "0.0000123"),
                                    (7, "7"), (1_234_567, "1,234,567"), (0.0, "0"), (None, "-")])
def test_number(v, text):
    assert number(v) == text


def test_distinct_bounds_differ():
    assert distinct(0.14, 0.1405) == ("0.140", "0.141")
    assert distinct(0.96, 1.0) == ("0.96", "1.00")
    assert distinct(2.0, 2.0) == ("2.00", "2.00")


def test_a_capacity_search_never_prints_equal_looking_bounds():
    s = ScaleSearch(scale=0.1401, failed_at=0.1443, precision=0.05, probes=())
    words = s.words()
    assert words.startswith("×0.140 (fails at ×0.144")


def test_a_missed_slo_reads_in_ms_and_s():
    from pathlib import Path

    from capacity.analyses.criteria import Budget, evaluate
    from replay.config import EngineConfig
    from replay.run import replay
    from traces.loaders import load_trace
    conv = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
    tables = replay(load_trace(conv).head(300), EngineConfig(num_gpu_blocks_override=600, block_size=16)).tables()
    c = evaluate(tables, slo_ttft_s=0.5, slo_tbt_s=0.005, budget=Budget.parse("any"))
    assert "TTFT p99 13.30 s > 500 ms" in c.breaks          # was "TTFT p99 13.3 s > 0.5 s"
    assert "TBT p99 23.6 ms > 5 ms" in c.breaks             # was "TBT p99 0.0236 s > 0.005 s"
