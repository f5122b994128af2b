"""Requests vLLM refuses are said where the verdict is (capacity/analyses/rejections.py).

Found off the corpus: Mooncake on Qwen3-32B (40,960-token context) under V0 rejected 39 of 835
requests; the plan said "fits" and, because the floor (the trace's p99-length prompt alone) was
one of them and never ran, also "long_prompt_prefill ... no replica count fixes it"."""
import polars as pl

from capacity.analyses.binding import diagnose
from capacity.analyses.plan import floor_trace
from capacity.analyses.rejections import rejections
from replay.config import EngineConfig, resolve

from capacity_helpers import conv800, kvcap_json  # noqa: F401 (conv800: a fixture)
from test_plan_parts import SLO, _point


def _requests(prompts, statuses) -> pl.DataFrame:
    return pl.DataFrame({"prompt_tokens": prompts, "status": statuses})


def test_counts_and_the_engines_own_rule():
    req = _requests([100, 2048, 2049, 900, 5000], ["finished", "rejected", "rejected",
                                                   "rejected", "finished"])
    v1 = rejections(req, resolve(EngineConfig(max_model_len=2048)))
    assert (v1.num_rejected, v1.num_requests, v1.longest_prompt_tokens) == (3, 5, 2049)
    # V1 refuses prompt >= max_model_len (one output token must fit); the 900-token one was too
    # large for the pool.
    assert v1.num_over_max_model_len == 2
    assert "rejects 3 of 5 requests (60.0%: prompt ≥ --max-model-len 2,048; more KV than the " \
           "whole GPU pool holds)" in v1.short()
    assert "--max-model-len up to the model's 131,072" in v1.words()
    v0 = rejections(req, resolve(EngineConfig(scheduler="v0", max_model_len=2048)))
    assert v0.num_over_max_model_len == 1 and "prompt > --max-model-len" in v0.short()
    assert rejections(_requests([1, 2], ["finished", "finished"]), resolve(EngineConfig())) is None


def test_at_the_models_own_context_the_knob_is_not_a_flag():
    req = _requests([40_000], ["rejected"])
    r = rejections(req, resolve(EngineConfig(model="mistral-7b")))
    assert r.max_model_len == r.model_max_len == 32_768
    assert "the model's own context" in r.words() and "more replicas do not help" in r.words()


def test_the_floor_is_a_prompt_the_engine_accepts():
    trace = pl.DataFrame({"request_id": list(range(200)), "arrival_s": [0.0] * 200,
                          "prompt_tokens": [100] * 190 + [50_000] * 10,
                          "output_tokens": [5] * 200, "prefix_hashes": [None] * 200},
                         schema_overrides={"prefix_hashes": pl.List(pl.Int64)})
    assert floor_trace(trace)["prompt_tokens"][0] == 50_000
    assert floor_trace(trace, 40_960)["prompt_tokens"][0] == 100
    # Every prompt too long: the floor stays the trace's (and never runs: see the next test).
    assert floor_trace(trace, 64)["prompt_tokens"][0] == 50_000
    # Too large for the whole KV pool alone: rejected as surely as too long for the context.
    assert floor_trace(trace, 131_072, 49_999)["prompt_tokens"][0] == 100


def test_the_floor_fits_the_pool_of_either_engine():
    """Found off the corpus: Llama-3.1-70B on 4 L40S (V0, 2,500 blocks) rejected Mooncake's
    p99 prompt for the pool, so the floor never ran and claimed nothing, while a lone 34k-token
    prompt took 80 s against a 2 s SLO: the plan searched 64 replicas instead of saying that no
    replica count helps."""
    from capacity.analyses.plan import lone_prompt_limit
    v0 = resolve(EngineConfig(scheduler="v0", num_gpu_blocks_override=2500))   # 16-token blocks
    assert lone_prompt_limit(v0) == (2500 - 1 - 25) * 16 - 3                    # 1% watermark
    v1 = resolve(EngineConfig(num_gpu_blocks_override=300))                     # 64-token blocks
    assert lone_prompt_limit(v1) == 299 * 64 - 3


def test_a_floor_that_never_ran_claims_no_prefill_time():
    never = _point(1.0, ttft_p99_s=None)
    b = diagnose((_point(1.0), _point(2.0, ttft_p99_s=7.0, ok=False, meets_slo=False)), never,
                 floor_prompt_tokens=121_301, scale=1.0, failed_at=2.0, **SLO)
    assert b.constraint == "compute" and b.replicas_help


def test_the_plan_says_how_many_requests_vllm_rejects(conv800, tmp_path):
    flags = ["--max-model-len", "2048", "--slo-ttft-p99", "5", "--slo-tbt-p99", "0.2",
             "--max-num-seqs-grid", "64,256", "--workers", "1"]
    doc = kvcap_json("report", conv800, "-o", tmp_path / "r", *flags)
    rec = doc["recommendation"]
    run = kvcap_json("replay", conv800, "--max-model-len", "2048", *rec["flags"],
                     "--db", tmp_path / "check.duckdb")
    n = run["requests_rejected"]
    assert n == 59                                  # conv800's prompts >= 2,048 tokens
    assert doc["rejected"]["requests"] == n and doc["rejected"]["over_max_model_len"] == n
    assert f"vLLM rejects {n} of 800 requests (7.4%: prompt ≥ --max-model-len 2,048)" \
        in rec["headline"]
    assert any(line.startswith(f"vLLM rejects {n} of 800") for line in rec["lines"])
    assert doc["binding_constraint"] != "long_prompt_prefill"
    assert doc["replicas"]["count"] is not None
    head = kvcap_json("headroom", conv800, *flags)
    assert head["rejected"] == doc["rejected"]


def _candidate(model: str, replicas: int, rejected: int):
    from capacity.analyses.fleetplan import CandidatePlan
    return CandidatePlan(gpu="h100", model=model, tensor_parallel_size=1, replicas=replicas,
                         linear_estimate=replicas, headroom_rate_scale=1.0, capacity_rps=1.0,
                         verdict="fits", flags=(), price_per_gpu_hour=3.0,
                         cost_per_hour=3.0 * replicas, fleet=None, one_fewer=None, probes=(),
                         explanation="", rejected=rejected)


def test_the_cheapest_fleet_serves_what_the_others_serve():
    """Mooncake at 0.1x: Mistral-7B (32,768-token context) needs 1 H100 but rejects 56 of 794
    requests; Llama-3.1-8B serves them all on 2. The cheaper fleet is no cheaper way to the same
    service."""
    from capacity.analyses.fleetplan import FleetPlan
    short, full = _candidate("mistral-7b", 1, 56), _candidate("llama-3.1-8b", 2, 0)
    p = FleetPlan(router="lor", slo_ttft_p99_s=10, slo_tbt_p99_s=0.3, plans=(short, full))
    assert p.cheapest is full and p.cheaper_but_rejecting == (short,)
    assert p.as_dict()["plans"][0]["rejected"] == 56
    both = FleetPlan(router="lor", slo_ttft_p99_s=10, slo_tbt_p99_s=0.3,
                     plans=(_candidate("a", 2, 5), _candidate("b", 1, 5)))
    assert both.cheapest.model == "b" and both.cheaper_but_rejecting == ()


def test_an_aborting_engine_is_said_first(tmp_path):
    """V0 swap whose victim needs more host blocks than the swap pool holds: vLLM aborts ("Aborted
    due to the lack of CPU swap space"), and the plan's headline said only "overloaded: serves
    0.32 of 0.70 req/s; the queue grows" (found on Mooncake, Qwen3-32B on H200, 1200 blocks)."""
    from traces.loaders import load_trace, write_trace
    from traces.transforms import scale_rate, time_window

    from capacity_helpers import CONV
    f = tmp_path / "moon.parquet"
    moon = load_trace(CONV.with_name("conversation_trace.jsonl"))
    write_trace(scale_rate(time_window(moon, 1200, 1320), 0.2), f)
    doc = kvcap_json("report", f, "-o", tmp_path / "r", "--scheduler", "v0", "--preemption-mode",
                     "swap", "--model", "qwen3-32b", "--gpu", "h200",
                     "--num-gpu-blocks-override", "1200", "--preemption-budget", "any",
                     "--workers", "1")
    head = doc["recommendation"]["headline"]
    assert doc["verdict"] == "overloaded"
    assert head.startswith("overloaded: the engine aborts at ") and \
        "Aborted due to the lack of CPU swap space" in head and "a larger --swap-space" in head


def test_rejected_requests_do_not_count_against_the_served_rate():
    """Stability compares the served rate with the *accepted* one: a refused request is never
    served, so with >= 5% rejected the old test (served < 95% of offered) held whatever the engine
    did and a burst still queued at the last arrival read as overload."""
    from capacity.analyses.stability import stability
    n = 100
    arrival = [float(i) for i in range(n)]                       # 1.01 req/s offered
    status = ["rejected" if i % 10 == 0 else "finished" for i in range(n)]
    # The 6 last accepted arrivals wait past the last arrival (a burst that then drains).
    late = [i for i in range(n) if status[i] == "finished"][-6:]
    sched = [None if status[i] == "rejected" else arrival[i] + (10.0 if i in late else 0.1)
             for i in range(n)]
    finish = [None if s is None else min(s + 1.0, 100.0) for s in sched]
    req = pl.DataFrame({"arrival_s": arrival, "status": status, "first_scheduled_s": sched,
                        "first_token_s": sched, "finish_s": finish},
                       schema_overrides={"first_scheduled_s": pl.Float64,
                                         "first_token_s": pl.Float64, "finish_s": pl.Float64})
    runs = pl.DataFrame({"sim_seconds": [100.0]})
    st = stability({"requests": req, "runs": runs})
    # 90 served over 100 s: 0.90 req/s, 99% of the 0.91 accepted, 89% of the 1.01 offered.
    assert (st.backlog_requests, round(st.served_rps, 2), round(st.offered_rps, 2)) == (6, 0.9, 1.01)
    assert st.sustainable, st.evidence
    # Beside rejected requests the served rate is read against the accepted one, in words too.
    assert st.serves() == "serves 0.90 of 1.01 req/s, 0.91 accepted"
    assert st.evidence.startswith("serves 0.90 of 1.01 req/s offered, 0.91 accepted; ")
    # The same 10 accepted but never served: now the engine really falls behind.
    queued = req.with_columns(pl.col("status").replace("rejected", "unfinished"))
    assert not stability({"requests": queued, "runs": runs}).sustainable
