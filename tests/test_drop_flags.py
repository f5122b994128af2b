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

