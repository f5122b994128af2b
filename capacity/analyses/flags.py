"""The `vllm serve` arguments that reproduce a replayed configuration, and back.

`vllm_flags(config)` spells out every setting a recommendation depends on (batch limits, prefix
caching, chunked prefill, scheduling policy, preemption mode and the host tier), resolved, so that
`apply_flags(base, vllm_flags(config))` replays exactly like `config` (tested). Flags are argv
tokens (["--max-num-seqs", "128", ...]). Queue-only (preemption_mode="none") has no vLLM
spelling: `vllm_flags` refuses it and callers say so in words.

The host tier: V0 `--preemption-mode swap --swap-space GiB` (per GPU); V1 (0.33) has no swap, its
tier is CPU KV offloading, `--kv-offloading-size GiB --kv-offloading-backend native` (in total over
the TP group). V1 also states its loop, `--async-scheduling` (0.33's default) or
`--no-async-scheduling`. The offloading connector's eviction policy and `offload_prompt_only` are
set in vLLM through `--kv-transfer-config` (kv_connector_extra_config); kvcap leaves them out at
vLLM's defaults (LRU, prompts only, no store threshold) and otherwise spells them as kvcap's own
flags (`--kv-offloading-eviction-policy arc`, `--no-offload-prompt-only`,
`--kv-offloading-store-threshold N`), which `kvcap replay` reads.
"""
from __future__ import annotations

import dataclasses
import shlex

from replay.config import EngineConfig, resolve

KV_OFFLOADING_BACKEND = "native"


class NotExpressible(ValueError):
    """The configuration has no vLLM flag (queue-only admission)."""


def vllm_flags(config: EngineConfig) -> tuple[str, ...]:
    if config.preemption_mode == "none":
        raise NotExpressible("queue-only admission (no preemption) has no vLLM flag")
    spec = resolve(config).spec
    out = ["--max-num-seqs", str(spec.max_num_seqs),
           "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
           "--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching",
           "--enable-chunked-prefill" if spec.enable_chunked_prefill else "--no-enable-chunked-prefill",
           "--scheduling-policy", spec.policy]
    if config.scheduler == "v0":
        out += ["--preemption-mode", config.preemption_mode]
        if config.preemption_mode == "swap":
            out += ["--swap-space", f"{config.swap_space:g}"]
        return tuple(out)
    if config.preemption_mode == "swap":
        raise NotExpressible("vLLM V1 has no swap preemption; its host tier is CPU KV offloading "
                             "(--kv-offloading-size)")
    out.append("--async-scheduling" if spec.async_scheduling else "--no-async-scheduling")
    if config.kv_offloading_size:
        # In total over the TP group (oracle README F12).
        out += ["--kv-offloading-size", f"{config.kv_offloading_size:g}",
                "--kv-offloading-backend", KV_OFFLOADING_BACKEND]
        if config.kv_offloading_eviction_policy != "lru":
            out += ["--kv-offloading-eviction-policy", config.kv_offloading_eviction_policy]
        if not config.offload_prompt_only:
            out.append("--no-offload-prompt-only")
        if config.kv_offloading_store_threshold:
            out += ["--kv-offloading-store-threshold", str(config.kv_offloading_store_threshold)]
    return tuple(out)


# A CPU tier's vLLM flags (kvcap's spellings of the connector's settings do nothing without it).
TIER_FLAGS = ("--kv-offloading-size", "--kv-offloading-backend")
# vLLM 0.34's cache-aware admission reorders by GPU prefix-cache hit: with prefix caching off it
# has nothing to order by (kvcap refuses the pair), so flags that turn caching off take it away.
WINDOW_FLAG = "--cache-aware-admission-window"


def dropped_flags(deployment: EngineConfig, chosen: EngineConfig) -> tuple[str, ...]:
    """The deployment's flags a recommendation takes away, which appending its flags cannot undo:
    vLLM has no flag that turns a V1 CPU tier off (a size of 0 is refused), and the deployment's
    cache-aware admission window cannot stay beside `--no-enable-prefix-caching`. A plan that
    leaves either out must say "leave these out" beside the flags it adds."""
    out: tuple[str, ...] = ()
    if deployment.scheduler == "v1" and deployment.kv_offloading_size \
            and not chosen.kv_offloading_size:
        out += TIER_FLAGS
    if deployment.cache_aware_admission_window and not chosen.cache_aware_admission_window:
        out += (WINDOW_FLAG,)
    return out


def drop_words(deployment: EngineConfig, drop: tuple[str, ...]) -> str:
    """What the plan says of `dropped_flags` (`drop`, not empty)."""
    words = []
    if TIER_FLAGS[0] in drop:
        words.append(f"leave --kv-offloading-size {deployment.kv_offloading_size:g} and "
                     "--kv-offloading-backend out of the deployment: vLLM has no flag that turns "
                     "the tier off")
    if WINDOW_FLAG in drop:
        words.append(f"leave {WINDOW_FLAG} {deployment.cache_aware_admission_window} out of the "
                     "deployment: it orders admissions by prefix-cache hit, and these flags turn "
                     "prefix caching off")
    return "; ".join(words)


# The model is the user's to fill in: a shell variable, so that the command pasted as printed
# runs (vLLM then names the missing model) instead of serving a placeholder word.
SERVE = 'vllm serve "$MODEL"'


def serve_command(flags) -> str:
    """`vllm serve "$MODEL" FLAGS` on one line, each token quoted for a POSIX shell: printed
    with soft wrapping only (a terminal's wrap is no newline), it pastes whole at any width."""
    return " ".join((SERVE, *map(shlex.quote, flags)))


def serve_lines(flags) -> str:
    """The same command as lines joined by backslash continuations, one `--flag value` per line
    (the report's code block): pasted, the shell reads one command."""
    lines = [SERVE]
    for tok in map(shlex.quote, flags):
        if tok.startswith("--") or len(lines) == 1:
            lines.append("  " + tok)
        else:
            lines[-1] += " " + tok
    return " \\\n".join(lines)


_VALUED = {"--max-num-seqs": ("max_num_seqs", int),
           "--max-num-batched-tokens": ("max_num_batched_tokens", int),
           "--scheduling-policy": ("scheduling_policy", str),
           "--preemption-mode": ("preemption_mode", str),
           "--swap-space": ("swap_space", float),
           "--kv-offloading-size": ("kv_offloading_size", float),
           "--kv-offloading-eviction-policy": ("kv_offloading_eviction_policy", str),
           "--kv-offloading-store-threshold": ("kv_offloading_store_threshold", int)}
_SWITCHES = {"--enable-prefix-caching": ("enable_prefix_caching", True),
             "--no-enable-prefix-caching": ("enable_prefix_caching", False),
             "--enable-chunked-prefill": ("enable_chunked_prefill", True),
             "--no-enable-chunked-prefill": ("enable_chunked_prefill", False),
             "--async-scheduling": ("async_scheduling", True),
             "--no-async-scheduling": ("async_scheduling", False),
             "--offload-prompt-only": ("offload_prompt_only", True),
             "--no-offload-prompt-only": ("offload_prompt_only", False)}


def apply_flags(base: EngineConfig, flags: list[str] | tuple[str, ...]) -> EngineConfig:
    """`base` with a full set of recommended vLLM flags applied (the inverse of `vllm_flags`)."""
    changes: dict = {}
    it = iter(flags)
    for flag in it:
        if flag in _SWITCHES:
            name, value = _SWITCHES[flag]
            changes[name] = value
            continue
        try:
            value = next(it)
        except StopIteration:
            raise ValueError(f"{flag}: missing its value") from None
        if flag in _VALUED:
            name, cast = _VALUED[flag]
            changes[name] = cast(value)
        elif flag == "--kv-offloading-backend":
            if value != KV_OFFLOADING_BACKEND:
                raise ValueError(f"--kv-offloading-backend: kvcap models {KV_OFFLOADING_BACKEND!r} "
                                 f"only, got {value!r}")
        else:
            raise ValueError(f"{flag}: not a flag kvcap recommends")
    if base.scheduler == "v1":
        changes["preemption_mode"] = "recompute"     # vLLM V1 only recomputes
        if "--kv-offloading-size" not in flags:
            changes["kv_offloading_size"] = None     # no CPU tier
    if changes.get("enable_prefix_caching") is False:
        changes["cache_aware_admission_window"] = 0  # nothing to order by (dropped_flags)
    return dataclasses.replace(base, **changes)
