"""A plan that drops the deployment's V1 CPU tier says to leave its flags out (vLLM has no flag
that turns the tier off, and refuses a size of 0).

Found off the corpus: Mooncake on V1 with `--kv-offloading-size 8` got flags without the tier and
numbers replayed without it, but `kvcap replay <deployment flags> <recommended flags>` kept the
8 GiB tier and gave other numbers (19 preemptions quoted, 18 replayed)."""
from capacity.analyses.flags import apply_flags, dropped_flags, vllm_flags
from replay.config import EngineConfig

from capacity_helpers import conv800, kvcap, kvcap_json  # noqa: F401 (conv800: a fixture)

TIER = EngineConfig(kv_offloading_size=8.0)


def test_only_a_dropped_v1_tier_is_named():
    assert dropped_flags(TIER, EngineConfig()) == ("--kv-offloading-size", "--kv-offloading-backend")
    assert dropped_flags(TIER, EngineConfig(kv_offloading_size=4.0)) == ()   # spelled: --size 4
    assert dropped_flags(EngineConfig(), EngineConfig()) == ()
    v0 = EngineConfig(scheduler="v0", preemption_mode="swap")
    assert dropped_flags(v0, EngineConfig(scheduler="v0")) == ()      # --preemption-mode says it
    # What the plan replays for a user who follows the flags: no tier.
    assert apply_flags(TIER, vllm_flags(EngineConfig())).kv_offloading_size is None


def test_the_deployment_less_the_dropped_flags_replays_the_quoted_row(conv800, tmp_path):
    dep = ["--kv-offloading-size", "8"]
    doc = kvcap_json("report", conv800, "-o", tmp_path / "r", *dep, "--max-num-seqs-grid",
                     "256,1024", "--workers", "1")
    rec = doc["recommendation"]
    assert "--kv-offloading-size" not in rec["flags"]           # the trace has no prefix reuse
    assert rec["drop_flags"] == ["--kv-offloading-size", "--kv-offloading-backend"]
    assert any("leave --kv-offloading-size 8 and --kv-offloading-backend out" in line
               for line in rec["lines"])
    run = kvcap_json("replay", conv800, *rec["flags"], "--db", tmp_path / "k.duckdb")
    assert run["num_cpu_blocks"] == 0 and run["ttft_p99_s"] == rec["expected"]["ttft_p99_s"]
    assert "leave out of the deployment's flags: --kv-offloading-size --kv-offloading-backend" \
        in kvcap("report", conv800, "-o", tmp_path / "r2", *dep, "--max-num-seqs-grid",
                 "256,1024", "--workers", "1", "--quiet").stdout.replace("\n", " ")



WINDOW = EngineConfig(cache_aware_admission_window=16)


def test_flags_that_turn_prefix_caching_off_take_the_admission_window_with_it():
    """vLLM 0.34's cache-aware admission orders by prefix-cache hit: kvcap refuses it beside
    `--no-enable-prefix-caching`. Found off the corpus: `kvcap report` and `compare-modes` with
    `--cache-aware-admission-window` died on that refusal, from compare-modes' prefix-off
    variant."""
    from capacity.analyses.modes import variant_config
    off = variant_config(WINDOW, "recompute")
    assert (off.enable_prefix_caching, off.cache_aware_admission_window) == (False, 0)
    assert variant_config(WINDOW, "recompute+prefix-cache").cache_aware_admission_window == 16
    followed = apply_flags(WINDOW, vllm_flags(off))          # what the user runs: no window
    assert (followed.enable_prefix_caching, followed.cache_aware_admission_window) == (False, 0)
    assert apply_flags(WINDOW, vllm_flags(EngineConfig())).cache_aware_admission_window == 16
    assert dropped_flags(WINDOW, off) == ("--cache-aware-admission-window",)
    assert dropped_flags(WINDOW, EngineConfig(cache_aware_admission_window=16)) == ()
    tier_and_window = EngineConfig(kv_offloading_size=8.0, cache_aware_admission_window=4)
    assert dropped_flags(tier_and_window, off) == ("--kv-offloading-size",
                                                   "--kv-offloading-backend",
                                                   "--cache-aware-admission-window")


def test_compare_modes_runs_every_variant_of_a_deployment_with_an_admission_window(conv800,
                                                                                  tmp_path):
    doc = kvcap_json("compare-modes", conv800, "--cache-aware-admission-window", "16",
                     "--num-gpu-blocks-override", "2000")
    assert {m["variant"] for m in doc["modes"]} >= {"recompute", "recompute+prefix-cache"}
