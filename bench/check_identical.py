"""Check that full replays reproduce saved tables exactly (the schedulers' optimisation guard).

    python bench/check_identical.py save  BASEDIR [NAME ...]   # write the baseline
    python bench/check_identical.py check BASEDIR [NAME ...]   # compare against it (exit 1 on diff)

Each case replays a real trace under one config and stores `requests`, `steps`, `events`,
`stalls`, `tbt` as parquet plus the run id; `check` compares them with `DataFrame.equals`
(NaNs equal), so any changed scheduling decision, step timing or block count shows up, and names
the first divergence (table, row, step / request, column, both values).
`--reference` replays on the Python reference implementation instead of the compiled core (slow:
use it on a few cases, e.g. `check BASE --reference conv_v1`).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import polars as pl

from replay.config import EngineConfig
from replay.engine.divergence import first_table_divergence
from replay.run import replay
from traces.loaders import load_trace

TRACES = {"conv": "../shared/traces/AzureLLMInferenceTrace_conv.csv",
          "mooncake": "../shared/traces/conversation_trace.jsonl"}
CASES = {
    "conv_v1": ("conv", dict()),
    # V1's synchronous loop (the default replays 0.33's async scheduler).
    "conv_v1_sync3000": ("conv", dict(async_scheduling=False, num_gpu_blocks_override=3000)),
    "conv_v0": ("conv", dict(scheduler="v0")),
    "mooncake_v1": ("mooncake", dict()),
    "conv_v1_3000": ("conv", dict(num_gpu_blocks_override=3000)),
    "conv_v0_3000": ("conv", dict(scheduler="v0", num_gpu_blocks_override=3000)),
    "conv_v0_swap3000": ("conv", dict(scheduler="v0", preemption_mode="swap",
                                      num_gpu_blocks_override=3000)),
    # Extra coverage: prefix caching under pressure, V0 caching, the large-batch regime.
    "mooncake_v0_cache": ("mooncake", dict(scheduler="v0", enable_prefix_caching=True)),
    "mooncake_v0_cache3000": ("mooncake", dict(scheduler="v0", enable_prefix_caching=True,
                                               num_gpu_blocks_override=3000)),
    "conv_v0_1000": ("conv", dict(scheduler="v0", num_gpu_blocks_override=1000)),
    "conv_v0_swap1000": ("conv", dict(scheduler="v0", preemption_mode="swap",
                                      on_swap_full="recompute", num_gpu_blocks_override=1000)),
    "conv_v0_chunked1000": ("conv", dict(scheduler="v0", enable_chunked_prefill=True,
                                         num_gpu_blocks_override=1000)),
    "synth_v1_1024": ("synth", dict(max_num_seqs=1024)),
    # The compiled V1 core's configurations under pressure (--reference gives the baseline).
    "mooncake_v1_3000": ("mooncake", dict(num_gpu_blocks_override=3000)),
    "mooncake_v1_nocache1500": ("mooncake", dict(enable_prefix_caching=False,
                                                 num_gpu_blocks_override=1500)),
    "conv_v1_none3000": ("conv", dict(preemption_mode="none", num_gpu_blocks_override=3000)),
    # vLLM 0.33's CPU KV offloading (the OffloadingConnector, timed transfers over the host
    # link) on the Mooncake conversation trace, whose prefix hashes make CPU hits: LRU with a
    # tier of 64 GiB, ARC with a small tier under GPU pressure, prompt-only off.
    "mooncake_v1_offload64": ("mooncake", dict(kv_offloading_size=64.0)),
    "mooncake_v1_offload_arc8_3000": ("mooncake", dict(kv_offloading_size=8.0,
                                                       kv_offloading_eviction_policy="arc",
                                                       num_gpu_blocks_override=3000)),
    "mooncake_v1_offload_full16": ("mooncake", dict(kv_offloading_size=16.0,
                                                    offload_prompt_only=False)),
    # The same connector on a trace without prefix information (every key a request's own),
    # and ARC with a small tier under GPU pressure.
    "conv_v1_offload64": ("conv", dict(kv_offloading_size=64.0)),
    "conv_v1_offload_arc2_1000": ("conv", dict(kv_offloading_size=2.0,
                                               kv_offloading_eviction_policy="arc",
                                               num_gpu_blocks_override=1000)),
    "conv_v1_1000_seqs64": ("conv", dict(num_gpu_blocks_override=1000, max_num_seqs=64)),
    "synth_v0_1024": ("synth", dict(scheduler="v0", max_num_seqs=1024)),
    # Priority scheduling with preemption (the priority-mix scenario: interactive + batch).
    "prio_v1_2000": ("prio", dict(scheduling_policy="priority", num_gpu_blocks_override=2000)),
    "prio_v0_2000": ("prio", dict(scheduler="v0", scheduling_policy="priority",
                                  num_gpu_blocks_override=2000)),
    # The compiled V0 core under swap pressure: prefix caching + swap-ins, chunked + fallbacks.
    "mooncake_v0_cache_swap3000": ("mooncake", dict(scheduler="v0", enable_prefix_caching=True,
                                                    preemption_mode="swap", on_swap_full="recompute",
                                                    num_gpu_blocks_override=3000)),
    "mooncake_v0_chunked_swap1000": ("mooncake", dict(scheduler="v0", enable_chunked_prefill=True,
                                                      preemption_mode="swap",
                                                      on_swap_full="recompute",
                                                      num_gpu_blocks_override=1000)),
}
TABLES = ("requests", "steps", "events", "stalls", "tbt")


def _trace(name: str, cache: dict) -> pl.DataFrame:
    if name not in cache:
        if name == "synth":
            from traces.synth import synthesize
            cache[name] = synthesize("poisson", rate_rps=60, duration_s=120)
        elif name == "prio":
            from traces.synth import synthesize
            cache[name] = synthesize("priority-mix", duration_s=600)
        else:
            cache[name] = load_trace(TRACES[name])
    return cache[name]


def main(argv: list[str]) -> int:
    impl = "reference" if "--reference" in argv else "compiled"
    argv = [a for a in argv if a != "--reference"]
    mode, base, names = argv[0], Path(argv[1]), argv[2:] or list(CASES)
    cache: dict = {}
    bad = 0
    for name in names:
        tname, kw = CASES[name]
        trace = _trace(tname, cache)
        c0 = time.process_time()
        r = replay(trace, EngineConfig(**kw), implementation=impl)
        cpu = time.process_time() - c0
        d = base / name
        if mode == "save":
            d.mkdir(parents=True, exist_ok=True)
            for t in TABLES:
                getattr(r, t).write_parquet(d / f"{t}.parquet")
            (d / "run_id").write_text(r.run_id)
            print(f"{name}: saved ({cpu:.2f} s cpu, {r.steps.height} steps)")
            continue
        diffs = []
        for t in TABLES:
            got, want = getattr(r, t), pl.read_parquet(d / f"{t}.parquet")
            if not got.equals(want, null_equal=True):
                diffs.append(first_table_divergence(got, want, t) or f"{t}: dtypes differ")
        if (d / "run_id").read_text() != r.run_id:
            diffs.append("run_id")
        bad += bool(diffs)
        print(f"{name}: {'DIFF ' + '; '.join(diffs) if diffs else 'identical'} "
              f"({impl}, {cpu:.2f} s cpu)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
