"""A TBT SLO below one decode step (capacity/analyses/binding.py, `decode_step`).

Found off the corpus: Llama-3.1-70B on 4 H100s, whose lone decode step takes ~14 ms, with a
15 ms TBT SLO was diagnosed `prefill_chunk` ("a smaller --max-num-batched-tokens") and sized at
42 replicas (168 GPUs for 15 req/s); at 10 ms, `prefill_chunk` again and a fleet search up to 64
replicas that no count could pass."""
import polars as pl

from capacity.analyses.binding import Binding, decode_bound
from capacity.analyses.plan import decode_floor_trace

from capacity_helpers import conv800, kvcap_json  # noqa: F401 (conv800: a fixture)
from test_plan_parts import _point

CHUNK = Binding(constraint="prefill_chunk", evidence="at ×2 of the load: TBT p99 40 ms > 30 ms",
                knob="a smaller --max-num-batched-tokens", floor=None, replicas_help=True)


def test_above_the_slo_no_batch_limit_or_replica_count_helps():
    b = decode_bound(CHUNK, _point(1.0, tbt_p99_s=0.035), prompt_tokens=7, slo_tbt_p99_s=0.03)
    assert b.constraint == "decode_step" and not b.replicas_help
    assert b.as_dict()["floor_tbt_s"] == 0.035 and "35.0 ms > the 30.0 ms TBT SLO" in b.evidence


def test_near_the_slo_it_is_said_and_below_it_nothing_changes():
    near = decode_bound(CHUNK, _point(1.0, tbt_p99_s=0.027), prompt_tokens=7, slo_tbt_p99_s=0.03)
    assert near.constraint == "prefill_chunk" and near.replicas_help
    assert "(90% of the TBT SLO)" in near.evidence
    far = decode_bound(CHUNK, _point(1.0, tbt_p99_s=0.006), prompt_tokens=7, slo_tbt_p99_s=0.03)
    assert far.evidence == CHUNK.evidence and far.decode_floor_s == 0.006


def test_the_decode_floor_is_the_shortest_prompt_the_engine_accepts():
    trace = pl.DataFrame({"request_id": [0, 1, 2, 3], "arrival_s": [0.0, 1.0, 2.0, 3.0],
                          "prompt_tokens": [900, 40, 40, 70_000], "output_tokens": [9, 8, 7, 6],
                          "prefix_hashes": [None] * 4},
                         schema_overrides={"prefix_hashes": pl.List(pl.Int64)})
    ft = decode_floor_trace(trace, 65_536)
    assert ft.select("request_id", "arrival_s", "prompt_tokens", "output_tokens").rows() \
        == [(1, 0.0, 40, 3)]


def test_a_tbt_slo_below_the_decode_step_is_diagnosed_with_its_knob(conv800, tmp_path):
    doc = kvcap_json("report", conv800, "-o", tmp_path / "r", "--model", "llama-3.1-70b",
                     "--tensor-parallel-size", "4", "--slo-tbt-p99", "0.01", "--workers", "1")
    b = doc["binding"]
    assert doc["binding_constraint"] == "decode_step" and b["replicas_help"] is False
    assert b["floor_tbt_s"] > 0.01 and doc["replicas"]["count"] is None
    assert "--tensor-parallel-size 8 meets the TBT SLO" in b["knob"] and "beyond" not in b["knob"]
    assert "no replica count fixes it" in doc["headline"] or \
        "no number of replicas fixes it" in doc["headline"]
    assert not any(d["knob"] == "--max-num-batched-tokens" for d in doc["departures"])


def test_with_chunked_prefill_off_the_knob_is_to_turn_it_on():
    """Found off the corpus: Mistral-7B on an H200 under V0 (chunked prefill off by default at
    its 32k context) was told "a smaller --max-num-batched-tokens" for a prefill_chunk binding,
    beside "chunked prefill is off: the chunk is the whole prompt"."""
    from capacity.analyses.criteria import Budget
    from capacity.analyses.plan import CHUNKING_OFF_KNOB, _diagnose, _Targets
    from capacity.analyses.search import ScaleSearch
    from replay.config import EngineConfig
    t = _Targets(slo_ttft_p99_s=5.0, slo_tbt_p99_s=0.05, budget=Budget(), precision=0.05)
    pts = (_point(1.0), _point(2.0, tbt_p99_s=0.09, ok=False, meets_slo=False,
                                breaks="TBT p99 90 ms > 50 ms"))
    rate = ScaleSearch(scale=1.0, failed_at=2.0, precision=0.05, probes=((1.0, True), (2.0, False)))
    floor = (_point(1.0, ttft_p99_s=0.1), 100)
    off = _diagnose(pts, floor, rate, t, config=EngineConfig(scheduler="v0", model="mistral-7b",
                                                             gpu="h200"))
    assert off.constraint == "prefill_chunk" and off.knob == CHUNKING_OFF_KNOB
    on = _diagnose(pts, floor, rate, t, config=EngineConfig(scheduler="v0"))
    assert on.constraint == "prefill_chunk" and on.knob.startswith("a smaller --max-num-batched")


def test_with_chunked_prefill_off_the_plan_searches_it_on(conv800, tmp_path):
    """Mistral-7B on an H200 under V0 (chunked prefill off by default at its 32k context), TBT
    bound by whole-prompt prefills: the plan replays chunked prefill on, at V0's chunked default
    and at smaller chunks, and turns it on only for a margin above the noise (it was named as
    the knob, never searched)."""
    doc = kvcap_json("report", conv800, "-o", tmp_path / "r", "--model", "mistral-7b", "--gpu",
                     "h200", "--scheduler", "v0", "--slo-tbt-p99", "0.03", "--workers", "1")
    dep = next(d for d in doc["departures"] if d["knob"] == "--enable-chunked-prefill")
    assert dep["default"] == "off, --max-num-batched-tokens 32768" and dep["gain"] > dep["threshold"]
    flags = doc["recommendation"]["flags"]
    assert "--enable-chunked-prefill" in flags
    mbt = int(flags[flags.index("--max-num-batched-tokens") + 1])
    assert dep["recommended"] == f"on, --max-num-batched-tokens {mbt}" and mbt <= 2048
    assert doc["binding_constraint"] != "prefill_chunk"


def test_the_chunk_search_never_goes_below_max_num_seqs(conv800, tmp_path):
    """Found off the corpus: --max-num-seqs 512 --max-num-batched-tokens 2048 with a TBT bound
    by the chunk crashed the plan ("max_num_batched_tokens: 256 is smaller than max_num_seqs
    512"): the search tried 2048/8, which vLLM refuses beside 512 sequences."""
    doc = kvcap_json("report", conv800, "-o", tmp_path / "r", "--max-num-seqs", "512",
                     "--max-num-batched-tokens", "2048", "--slo-tbt-p99", "0.02", "--workers", "1")
    dep = next(d for d in doc["departures"] if d["knob"] == "--max-num-batched-tokens")
    assert dep["default"] == 2048 and 512 <= dep["recommended"] < 2048
    flags = doc["recommendation"]["flags"]
    assert flags[flags.index("--max-num-batched-tokens") + 1] == str(dep["recommended"])
