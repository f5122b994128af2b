"""Shared pieces of the CLI: errors, JSON output, the engine flags (vLLM spellings).

`engine_flags` adds every engine flag of DESIGN §7 to a typer command and hands the command one
`EngineConfig` (argument `engine`), so all commands parse the flags the same way.
"""
from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Optional

import typer


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


def fail(message: str) -> None:
    typer.echo(f"kvcap: error: {message}", err=True)
    raise typer.Exit(2)


def emit_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, default=_json_default, sort_keys=False) + "\n")


def _json_default(o):
    import numpy as np
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


def guarded(fn):
    """Turn expected failures (bad input, locked DB, bad config) into one line and exit 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from replay.store import StoreLocked
        from traces.schema import TraceError
        try:
            return fn(*args, **kwargs)
        except (CliError, TraceError, StoreLocked, ValueError, FileNotFoundError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            fail(msg)
        except KeyboardInterrupt:
            typer.echo("kvcap: interrupted; nothing was written for the unfinished run", err=True)
            raise typer.Exit(130)
    return wrapper


# name -> (annotation, typer.Option). Defaults None mean "vLLM's version/hardware default".
ENGINE_FLAGS: dict[str, tuple] = {
    "scheduler": (str, typer.Option("v1", "--scheduler", help="vLLM engine: v0 (<=0.10) or v1.")),
    "model": (str, typer.Option("llama-3.1-8b", "--model", help="Catalog name, HF id or config.json path.")),
    "gpu": (str, typer.Option("h100", "--gpu", help="a100-40gb, a100-80gb, h100, h100-pcie, h200, l40s, b200.")),
    "tensor_parallel_size": (int, typer.Option(1, "--tensor-parallel-size", "-tp")),
    "max_num_seqs": (Optional[int], typer.Option(None, "--max-num-seqs")),
    "max_num_batched_tokens": (Optional[int], typer.Option(None, "--max-num-batched-tokens")),
    "max_model_len": (Optional[int], typer.Option(None, "--max-model-len")),
    "block_size": (int, typer.Option(16, "--block-size")),
    "gpu_memory_utilization": (Optional[float], typer.Option(None, "--gpu-memory-utilization")),
    "swap_space": (float, typer.Option(4.0, "--swap-space", help="GiB per GPU (V0 swap / V1 offload tier).")),
    "preemption_mode": (str, typer.Option("recompute", "--preemption-mode", help="recompute | swap | none (queue only).")),
    "on_swap_full": (str, typer.Option("abort", "--on-swap-full", help="abort (like vLLM V0) | recompute.")),
    "scheduling_policy": (str, typer.Option("fcfs", "--scheduling-policy", help="fcfs | priority.")),
    "enable_prefix_caching": (Optional[bool], typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching")),
    "enable_chunked_prefill": (Optional[bool], typer.Option(None, "--enable-chunked-prefill/--no-enable-chunked-prefill")),
    "kv_cache_dtype": (str, typer.Option("auto", "--kv-cache-dtype", help="auto | fp8.")),
    "num_gpu_blocks_override": (Optional[int], typer.Option(None, "--num-gpu-blocks-override")),
    "num_cpu_blocks_override": (Optional[int], typer.Option(None, "--num-cpu-blocks-override")),
}


def engine_flags(fn):
    """Decorator: add ENGINE_FLAGS to the command's signature; pass `engine=EngineConfig(...)`."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "engine"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for name, (ann, opt) in ENGINE_FLAGS.items()]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from replay.config import EngineConfig
        flags = {k: kwargs.pop(k) for k in list(kwargs) if k in ENGINE_FLAGS}
        try:
            engine = EngineConfig(**flags)
        except (ValueError, TypeError) as e:
            fail(str(e).splitlines()[0])
        return fn(*args, engine=engine, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)
    return wrapper


def load_trace_file(path: Path, *, trace_format: str | None = None):
    from traces.loaders import load_trace
    if not Path(path).exists():
        raise CliError(f"{path}: no such file")
    return load_trace(path, format=trace_format)


def trace_input(file: Optional[Path], trace_format: Optional[str], rate_scale: float = 1.0):
    """The trace a command works on (the built-in default scenario when no file), rate-scaled,
    and a name for it."""
    if file is None:
        from traces.synth import DEFAULT_SCENARIO, default_trace
        trace, name = default_trace(), f"built-in scenario {DEFAULT_SCENARIO}"
    else:
        trace, name = load_trace_file(file, trace_format=trace_format), file.name
    if rate_scale != 1.0:
        from traces.transforms import scale_rate
        trace = scale_rate(trace, rate_scale)
    return trace, name


def store_runs(db: Optional[Path], runs: list) -> None:
    """Write each distinct run once (analyses share replays)."""
    if db is None:
        return
    from replay.store import write_run
    for r in {r.run_id: r for r in runs}.values():
        write_run(db, r.tables())
