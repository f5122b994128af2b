"""Which vLLM a run replayed, in the words every answer uses (issue 32: each answer names it).

One function so that the report, the terminal tables and the JSON say the same thing: the
release (V0 is 0.10.1.1; V1 0.33 or 0.34, 0.34 by default), its KV block size (16 up to 0.33,
64 from 0.34: the prefix-hit granularity) and the engine loop. And what priced its steps
(`step_times`): measured kernels, a calibration profile, or the analytic roofline, which is
less accurate (docs/timing.md), so an answer resting on it says so.
"""
from __future__ import annotations


LCF_WORDS = ("what-if: least-computed-first preemption victim (vLLM PR #53723, open, in no "
             "release)")


def engine_words(scheduler: str, vllm_version: str | None, scheduler_loop: str | None,
                 block_size: int | None = None, preemption_victim: str | None = None) -> str:
    """"vLLM 0.34 (V1, 64-token blocks), async scheduling (the default)" and the like.
    `vllm_version` None: a run stored before runs recorded it (V1 was then 0.33). A replay of
    the LCF what-if says so: it is no vLLM release."""
    blocks = f", {block_size}-token blocks" if block_size else ""
    if scheduler == "v0":
        return f"vLLM 0.10.1.1 (V0{blocks}), synchronous engine loop"
    version = vllm_version or "0.33"
    loop = ("async scheduling (the default)" if scheduler_loop == "async"
            else "synchronous scheduling (--no-async-scheduling)")
    lcf = f"; {LCF_WORDS}" if preemption_victim == "lcf" else ""
    return f"vLLM {version} (V1{blocks}), {loop}{lcf}"


def preemption_victim_of(run: dict) -> str | None:
    """The run's preemption_victim, from its stored config (absent: vLLM's fcfs)."""
    import json
    try:
        return json.loads(run.get("config_json") or "{}").get("preemption_victim")
    except (TypeError, ValueError):
        return None


def run_engine_words(run: dict) -> str:
    """engine_words of a `runs` row."""
    loop = "async" if run.get("async_scheduling") else "sync"
    return engine_words(run.get("scheduler", "v1"), run.get("vllm_version"), loop,
                        run.get("block_size"), preemption_victim_of(run))


def step_times(config) -> str:
    """"measured" (a shipped profile of this GPU x model x KV dtype x TP), "calibration" (a
    `--calibration` profile) or "roofline" (neither: replay.timing.executors.measured_for)."""
    from replay.config import resolve
    from replay.timing.executors import has_measured_timing
    if config.calibration:
        return "calibration"
    return "measured" if has_measured_timing(resolve(config)) else "roofline"


def step_time_words(config) -> str:
    from replay.config import resolve
    source = step_times(config)
    if source == "calibration":
        return f"step times: the calibration profile {config.calibration}"
    eng = resolve(config)
    where = (f"{eng.model.name} on {eng.gpu.name} at TP {config.tensor_parallel_size}"
             + (f", {config.kv_cache_dtype} KV cache" if config.kv_cache_dtype != "auto" else ""))
    if source == "measured":
        return f"step times: measured kernels of {where} (NVIDIA AIConfigurator)"
    return (f"step times: the analytic roofline — no measured profile of {where}; less accurate "
            "than measured kernels (docs/timing.md), so read close calls with care")
