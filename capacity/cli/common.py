"""Shared pieces of the CLI: errors, JSON output, the engine flags (vLLM spellings).

`engine_flags` adds every engine flag of DESIGN §7 to a typer command and hands the command one
`EngineConfig` (argument `engine`), so all commands parse the flags the same way; `trace_flags`
adds `--arrivals` / `--seed`, which every trace the command loads then gets (a lengths-only one).
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


def fail(message: str) -> None:
    from traces.schema import printable
    # One line, control characters escaped: a value echoed from a file must not drive the terminal.
    first = (message.strip().splitlines() or ["error"])[0]
    typer.echo(f"kvcap: error: {printable(first)}", err=True)
    raise typer.Exit(2)


def shown(value) -> str:
    """Text from data (file names, labels, tenants, stored run labels) as a terminal shows it:
    control characters escaped (traces.schema.printable: an ESC from a file must not drive the
    terminal) and Rich markup escaped (a `[bold]` in a label is text, not style)."""
    from rich.markup import escape
    from traces.schema import printable
    return escape(printable(str(value)))


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
        from replay.results.dbfile import StoreLocked, WriteInterrupted
        from traces.schema import TraceError
        try:
            check_flags(fn.__name__, kwargs)
            return fn(*args, **kwargs)
        except (CliError, TraceError, StoreLocked, ValueError, FileNotFoundError,
                IsADirectoryError, NotADirectoryError, PermissionError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            fail(msg)
        except OSError as e:  # disk full, read-only folder: the real reason, one line
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            fail(f"{where}{e.strerror or e}; nothing more was written")
        except WriteInterrupted as e:
            said = ("the run being written was committed to " if e.committed
                    else "nothing was written for the unfinished run to ") + e.path
            typer.echo(f"kvcap: interrupted; {said}", err=True)
            raise typer.Exit(130)
        except KeyboardInterrupt:
            typer.echo("kvcap: interrupted; nothing was written for the unfinished run", err=True)
            raise typer.Exit(130)
        except Exception as e:
            from concurrent.futures.process import BrokenProcessPool
            if isinstance(e, RuntimeError) and "interrupted" in str(e).lower():
                # Ctrl-C inside a DuckDB query arrives as "Query interrupted": nothing was
                # committed by that query (a transaction in flight is rolled back)
                typer.echo("kvcap: interrupted; nothing was written for the unfinished work", err=True)
                raise typer.Exit(130)
            if isinstance(e, BrokenProcessPool):
                # A worker died (the out-of-memory killer, a crash): capacity/analyses/sweep.py's
                # WorkerDied names the replay and the likely cause in its one line.
                fail(str(e) if type(e).__name__ == "WorkerDied" else
                     "a worker process died (most likely killed for memory, else it crashed): "
                     "lower --workers, or rerun with --workers 1 to see the error")
            # A DuckDB error from an analysis query on a damaged or foreign database (duckdb is not
            # imported here: most commands never load it).
            if type(e).__module__.split(".")[0] not in ("duckdb", "_duckdb"):
                raise
            fail(f"database error ({type(e).__name__}): {str(e).strip() or type(e).__name__}")
    return wrapper


# ------------------------------------------------------------------ flag checks at the boundary
# Parameter name -> (flag, rule). Every command goes through `guarded`, which applies the rules of
# the parameters it has before any work starts: a bad value is one line naming the flag and the fix.
def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


_POSITIVE = (lambda x: _finite(x) and x > 0, "a finite number > 0")
_NON_NEGATIVE = (lambda x: _finite(x) and x >= 0, "a finite number >= 0")
FLAG_RULES: dict[str, tuple[str, tuple]] = {
    # A rate scaled beyond this makes a trace of seconds span more than a lifetime (or a day's
    # requests arrive within a nanosecond): the replay's times lose their meaning.
    "rate_scale": ("--rate-scale", (lambda x: _finite(x) and 1e-6 <= x <= 1e6,
                                    "a finite factor from 1e-6 to 1e6")),
    "headroom": ("--headroom", (lambda x: _finite(x) and 0 <= x <= 10, "a fraction from 0 to 10 (0.2 = 20 %)")),
    "what_if": ("--what-if", (lambda x: _finite(x) and 0 < x <= 1, "a fraction > 0 and <= 1")),
    "host_ram_gib": ("--host-ram-gib", (lambda x: _finite(x) and 0 < x <= 2**20,
                                        "GiB > 0 and at most 1048576 (1 PiB)")),
    "context_tokens": ("--context-tokens", (lambda x: x >= 1, "a whole number >= 1")),
    "slo_ttft_p99": ("--slo-ttft-p99", _POSITIVE),
    "slo_tbt_p99": ("--slo-tbt-p99", _POSITIVE),
    "workers": ("--workers", (lambda x: 1 <= x <= 1024, "a whole number from 1 to 1024")),
    "target_peak": ("--target-peak", _POSITIVE),
    "max_preemptions_per_minute": ("--max-preemptions-per-minute", _NON_NEGATIVE),
    "window_s": ("--window-s", _POSITIVE),
    "threshold_s": ("--threshold-s", _NON_NEGATIVE),
    "offset_s": ("--offset-s", (_finite, "a finite number of seconds")),
    "year": ("--year", (lambda x: 1970 <= x <= 2200, "a year from 1970 to 2200")),
    "engine": ("--engine", (lambda x: x >= 0, "a whole number >= 0")),
    "kv_offloading_size": ("--kv-offloading-size", (lambda x: _finite(x) and 0 <= x <= 4096,
                                                    "GiB from 0 to 4096 (the whole TP group)")),
    "tolerance": ("--tolerance", (lambda x: _finite(x) and 0 <= x < 1,
                                  "a fraction from 0 to below 1 (0.05 = 5 %)")),
    "precision": ("--precision", (lambda x: _finite(x) and 0.001 <= x <= 0.5,
                                  "a relative precision from 0.001 to 0.5 (0.05 = 5 %)")),
    "max_error_pct": ("--max-error-pct", (lambda x: _finite(x) and 0 <= x <= 1000,
                                          "a percentage from 0 to 1000")),
    "hash_block_tokens": ("--hash-block-tokens", (lambda x: 1 <= x < 2**31, "a whole number of "
                                                  "prompt tokens per prefix hash from 1 to "
                                                  "2147483647 (Mooncake: 512)")),
}
# Comma lists: parameter -> (flag, element type, rule).
LIST_RULES: dict[str, tuple[str, type, tuple]] = {
    "sweep": ("--sweep", float, (lambda x: _finite(x) and 0 < x <= 10, "fractions of the peak > 0, e.g. 0.25,0.5,1")),
    "sizes": ("--sizes", float, (lambda x: _finite(x) and 0 <= x <= 4096,
                                 "GiB from 0 to 4096, e.g. 0,16,32,64")),
    "scales": ("--scales", float, (lambda x: _finite(x) and 0 < x <= 1000, "rate scales > 0, e.g. 1,1.5,2")),
    "max_num_seqs_grid": ("--max-num-seqs-grid", int, (lambda x: 1 <= x < 2**31, "whole numbers >= 1, e.g. 64,128,256")),
    "max_num_batched_tokens_grid": ("--max-num-batched-tokens-grid", int,
                                    (lambda x: 1 <= x < 2**31, "whole numbers >= 1, e.g. 2048,8192")),
}
# Commands whose --db is only read: it must exist.
_READS_DB = {"attribute_cmd", "validate_cmd", "export_cmd", "runs_cmd"}
# Output paths: parameter -> (flag, what it must be). report writes a folder, the others a file.
_OUTPUT_DIR_COMMANDS = {"report_cmd": "the report (index.html, figures)",
                        "export_cmd": "the export (one file per table)"}
# The format each file-writing command writes (traces.atomic.FORMATS; its -o extension must agree).
_OUTPUT_FORMATS = {"alerts_cmd": "YAML", "calibrate_cmd": "JSON"}


def _output_format(command: str, out: Path) -> str | None:
    if command == "size_offload_cmd":   # the chart's format is the extension's; anything else: PNG
        return {".svg": "SVG", ".html": "HTML", ".htm": "HTML"}.get(out.suffix.lower(), "PNG")
    return _OUTPUT_FORMATS.get(command)


# Text flags that end up inside a generated file (a PromQL selector in YAML rules): printable
# characters only. NEL (U+0085) and LS/PS (U+2028/9) are line breaks to YAML, so a label value
# holding one would make the rule watch another value.
TEXT_FLAGS = {"model_name": "--model-name"}


def check_flags(command: str, kwargs: dict) -> None:
    """Apply FLAG_RULES / LIST_RULES / TEXT_FLAGS and the path checks to a command's arguments."""
    for name, value in kwargs.items():
        if value is None or isinstance(value, bool):
            continue
        if name in TEXT_FLAGS and isinstance(value, str) and not value.isprintable():
            bad = next(c for c in value if not c.isprintable())
            raise CliError(f"{TEXT_FLAGS[name]}: holds the character U+{ord(bad):04X}, which is not "
                           "printable (a line break or control character); give the label value "
                           "as Prometheus shows it")
        if name in FLAG_RULES and isinstance(value, (int, float)):
            flag, (ok, what) = FLAG_RULES[name]
            if not ok(value):
                raise CliError(f"{flag} {value!r}: must be {what}")
        elif name in LIST_RULES and isinstance(value, str):
            flag, kind, (ok, what) = LIST_RULES[name]
            for item in (x.strip() for x in value.split(",")):
                if not item:
                    continue
                try:
                    number = kind(item)
                except ValueError:
                    raise CliError(f"{flag}: {item!r} is not a number; give {what}") from None
                if not ok(number):
                    raise CliError(f"{flag}: {item!r} is out of range; give {what}")
    _check_paths(command, kwargs)


def _check_paths(command: str, kwargs: dict) -> None:
    from replay.results.dbfile import check_db_file
    db = kwargs.get("db")
    if isinstance(db, Path):
        check_db_file(db, must_exist=command in _READS_DB)
    calibration = kwargs.get("calibration")
    if isinstance(calibration, Path):
        from replay.timing.cost_model import read_profile
        read_profile(calibration)  # a bad profile is refused before the replay, not after it
    for name, flag in (("out", "-o"), ("output", "-o")):
        out = kwargs.get(name)
        if not isinstance(out, Path):
            continue
        if command in _OUTPUT_DIR_COMMANDS:
            if out.exists() and not out.is_dir():
                raise CliError(f"{flag} {out}: is a file; {_OUTPUT_DIR_COMMANDS[command]} is a "
                               "folder; pass a folder name")
        elif out.is_dir():
            raise CliError(f"{flag} {out}: is a folder; pass a file name")
        elif not (out.parent if str(out.parent) else Path(".")).is_dir():
            raise CliError(f"{flag} {out}: folder {out.parent} does not exist; create it first")
        else:
            from traces.atomic import check_output
            check_output(out, flag=flag, fmt=_output_format(command, out),
                         inputs=[p for k, v in kwargs.items() if k != name
                                 for p in (v if isinstance(v, (list, tuple)) else [v])
                                 if isinstance(p, Path)])


# name -> (annotation, typer.Option). Defaults None mean "vLLM's version/hardware default".
ENGINE_FLAGS: dict[str, tuple] = {
    "scheduler": (str, typer.Option("v1", "--scheduler", help="vLLM engine: v0 (<=0.10) or v1.")),
    "vllm_version": (Optional[str], typer.Option(None, "--vllm-version", help="V1 release whose defaults and behaviours are replayed: 0.33 | 0.34 (default 0.34, the latest).")),
    "model": (str, typer.Option("llama-3.1-8b", "--model", help="Catalog name, HF id or config.json path.")),
    "gpu": (str, typer.Option("h100", "--gpu", help="a100-40gb, a100-80gb, h100, h100-pcie, h200, l40s, b200.")),
    "tensor_parallel_size": (int, typer.Option(1, "--tensor-parallel-size", "-tp")),
    "max_num_seqs": (Optional[int], typer.Option(None, "--max-num-seqs")),
    "max_num_batched_tokens": (Optional[int], typer.Option(None, "--max-num-batched-tokens")),
    "max_model_len": (Optional[int], typer.Option(None, "--max-model-len")),
    "block_size": (Optional[int], typer.Option(None, "--block-size", help="KV block, tokens (default 16; 64 on vLLM 0.34).")),
    "gpu_memory_utilization": (Optional[float], typer.Option(None, "--gpu-memory-utilization")),
    "swap_space": (float, typer.Option(4.0, "--swap-space", help="V0: swap pool, GiB per GPU (V1's host tier is --kv-offloading-size).")),
    "preemption_mode": (str, typer.Option("recompute", "--preemption-mode", help="recompute | swap (V0) | none (queue only).")),
    "on_swap_full": (str, typer.Option("abort", "--on-swap-full", help="abort (like vLLM V0) | recompute.")),
    "scheduling_policy": (str, typer.Option("fcfs", "--scheduling-policy", help="fcfs | priority.")),
    "enable_prefix_caching": (Optional[bool], typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching")),
    "enable_chunked_prefill": (Optional[bool], typer.Option(None, "--enable-chunked-prefill/--no-enable-chunked-prefill")),
    "kv_cache_dtype": (str, typer.Option("auto", "--kv-cache-dtype", help="auto | fp8.")),
    "async_scheduling": (Optional[bool], typer.Option(None, "--async-scheduling/--no-async-scheduling", help="V1: 0.33's async scheduler (step k scheduled before step k-1's output is applied).")),
    "num_gpu_blocks_override": (Optional[int], typer.Option(None, "--num-gpu-blocks-override")),
    "num_cpu_blocks_override": (Optional[int], typer.Option(None, "--num-cpu-blocks-override")),
    # V1 0.33's CPU KV offloading (the native OffloadingConnector), GiB for all TP ranks.
    "kv_offloading_size": (Optional[float], typer.Option(None, "--kv-offloading-size",
                                                         help="V1: CPU KV offloading tier, GiB for all TP ranks together (0 = off).")),
    "kv_offloading_backend": (str, typer.Option("native", "--kv-offloading-backend",
                                                help="V1: native (the only one modelled).")),
    "kv_offloading_eviction_policy": (str, typer.Option("lru", "--kv-offloading-eviction-policy",
                                                        help="V1 offloading: lru | arc (kv_connector_extra_config eviction_policy).")),
    "offload_prompt_only": (bool, typer.Option(True, "--offload-prompt-only/--no-offload-prompt-only",
                                               help="V1 offloading: store prompt blocks only (vLLM's default).")),
    "kv_offloading_store_threshold": (int, typer.Option(0, "--kv-offloading-store-threshold",
                                                        help="V1 offloading: store a chunk from its N-th offer on (kv_connector_extra_config store_threshold; 0 = at once).")),
    "cache_aware_admission_window": (int, typer.Option(0, "--cache-aware-admission-window",
                                                       help="vLLM 0.34: admit the deepest cached prefix first among the first N waiting requests (0 = off).")),
    "cache_aware_admission_threshold": (float, typer.Option(0.5, "--cache-aware-admission-threshold",
                                                            help="vLLM 0.34: KV usage from which the admission window reorders.")),
    "max_num_inflight_kv_loads": (Optional[int], typer.Option(None, "--max-num-inflight-kv-loads",
                                                              help="vLLM 0.34: cap on concurrent KV connector loads.")),
    "preemption_victim": (str, typer.Option("fcfs", "--preemption-victim",
                                            help="V1 what-if: fcfs (vLLM) | lcf (fewest computed tokens first; vLLM PR #53723, in no release).")),
}


def engine_flags(fn):
    """Decorator: add ENGINE_FLAGS to the command's signature; pass `engine=EngineConfig(...)`."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "engine"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for name, (ann, opt) in ENGINE_FLAGS.items()]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        flags = {k: kwargs.pop(k) for k in list(kwargs) if k in ENGINE_FLAGS}
        try:
            engine = engine_config(flags)
        except (ValueError, TypeError) as e:
            fail(str(e).splitlines()[0])
        return fn(*args, engine=engine, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)
    return wrapper


def engine_config(flags: dict):
    """The EngineConfig of the ENGINE_FLAGS values `flags`; ValueError with one line when they
    do not make an engine (`--kv-offloading-size` is the connector's EngineConfig field)."""
    from replay.config import EngineConfig
    return EngineConfig(**flags)


# Every command that loads a trace: how many prompt tokens one of its prefix hashes stands for.
HASH_BLOCK_TOKENS_OPTION = typer.Option(
    None, "--hash-block-tokens", help="Prompt tokens per prefix hash of the trace "
    "(default: the trace's own, Mooncake hash_ids: 512).")

# Every command that loads a trace: synthetic arrivals for a lengths-only trace (`trace_flags`).
ARRIVALS_HELP = ("A lengths-only trace's arrivals (Vidur arxiv-summarization, BWB): poisson:RATE "
                 "or gamma:RATE:CV, RATE in req/s.")
SEED_HELP = "Seed of --arrivals (default 0): the same seed, the same arrival times."
_ARRIVALS: contextvars.ContextVar = contextvars.ContextVar("kvcap_arrivals", default=None)


def trace_flags(fn):
    """Decorator: add `--arrivals SPEC` and `--seed N` to a command that loads a trace; the
    traces it loads (`load_trace_file`, `trace_input`) get those arrivals while it runs."""
    sig = inspect.signature(fn)
    extra = [inspect.Parameter("arrivals", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                               default=typer.Option(None, "--arrivals", help=ARRIVALS_HELP)),
             inspect.Parameter("seed", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int],
                               default=typer.Option(None, "--seed", help=SEED_HELP))]

    @functools.wraps(fn)
    def wrapper(*args, arrivals: str | None = None, seed: int | None = None, **kwargs):
        from traces.arrivals import parse_arrivals
        if arrivals is None and seed is not None:
            raise CliError(f"--seed {seed}: seeds --arrivals (a lengths-only trace's arrival "
                           "times); give --arrivals too, or drop --seed")
        token = _ARRIVALS.set(None if arrivals is None else parse_arrivals(arrivals, seed or 0))
        try:
            return fn(*args, **kwargs)
        finally:
            _ARRIVALS.reset(token)

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
    return wrapper


def load_trace_file(path: Path, *, trace_format: str | None = None,
                    hash_block_tokens: int | None = None):
    return load_trace_report(path, trace_format=trace_format, hash_block_tokens=hash_block_tokens)[0]


def load_trace_report(path: Path, *, trace_format: str | None = None,
                      hash_block_tokens: int | None = None):
    """(trace, LoadReport) of `path`, with the command's --arrivals when it has them."""
    from traces.loaders import load_trace_with_report
    if not Path(path).exists():
        raise CliError(f"{path}: no such file")
    return load_trace_with_report(path, format=trace_format, hash_block_tokens=hash_block_tokens,
                                  arrivals=_ARRIVALS.get())


# The planning analyses bin simulated time in 60-s windows (classify, preemptions per minute):
# more bins than this (and than 100 per request) means a stray timestamp, not a long trace.
MAX_TIME_BINS = 1_000_000


def check_span(trace, name: str, window_s: float = 60.0) -> None:
    """Refuse, before any replay, a trace whose time span the analyses cannot bin by the minute
    within its work (one year-2100 timestamp in a 2023 trace: 40M windows for 2,000 requests),
    naming the request after the widest gap."""
    import numpy as np
    t = np.sort(trace["arrival_s"].to_numpy()) if trace.height else np.zeros(1)
    bins = (t[-1] - t[0]) / window_s
    if bins <= max(MAX_TIME_BINS, 100 * trace.height):
        return
    gaps = np.diff(t)
    i = int(np.argmax(gaps))
    row = trace.filter(trace["arrival_s"] == t[i + 1]).row(0, named=True)
    raise ValueError(
        f"{name}: request_id {row['request_id']} arrives {gaps[i]:,.0f} s ({gaps[i] / 3.156e7:,.1f} "
        f"years) after the one before it; the trace spans {bins:,.0f} windows of {window_s:g} s for "
        f"{trace.height:,} requests; drop that request or fix its timestamp")


def check_rate(trace, name: str) -> None:
    """Refuse, before any replay, a trace with no request rate: one request, or all of them at
    the same instant (an offline batch). Every planning answer is a multiple of that rate."""
    n = trace.height
    t = trace["arrival_s"]
    if n >= 2 and t.max() > t.min():
        return
    what = (f"{name}: one request has no request rate" if n < 2 else
            f"{name}: all {n:,} requests arrive at t = {t.min():g} s, so there is no request rate")
    raise ValueError(f"{what} to plan for; `kvcap replay` replays it as it is (a batch: its makespan), "
                     "or drop its arrival column and give --arrivals poisson:RATE")


def trace_input(file: Optional[Path], trace_format: Optional[str], rate_scale: float = 1.0,
                *, binned: bool = True, hash_block_tokens: int | None = None):
    """The trace a command works on (the built-in default scenario when no file), rate-scaled,
    and a name for it; `binned`: the command bins time (`check_span`); `hash_block_tokens`:
    `--hash-block-tokens`, the trace's tokens per prefix hash."""
    trace, name, _ = trace_input_arrivals(file, trace_format, rate_scale, binned=binned,
                                          hash_block_tokens=hash_block_tokens)
    return trace, name


def trace_input_arrivals(file: Optional[Path], trace_format: Optional[str],
                         rate_scale: float = 1.0, *, binned: bool = True,
                         hash_block_tokens: int | None = None):
    """`trace_input` and the synthetic arrivals its trace has (None: its own times); the name
    says them ('arxiv.csv, poisson:5 seed 0 arrivals')."""
    if file is None:
        if _ARRIVALS.get() is not None:
            raise CliError("--arrivals: the built-in scenario has its own arrival times; give a "
                           "lengths-only trace file")
        from traces.synth import DEFAULT_SCENARIO, default_trace
        trace, name, arrivals = default_trace(), f"built-in scenario {DEFAULT_SCENARIO}", None
    else:
        trace, report = load_trace_report(file, trace_format=trace_format,
                                          hash_block_tokens=hash_block_tokens)
        arrivals = report.arrivals
        name = file.name + (f", {arrivals} arrivals" if arrivals else "")
    if rate_scale != 1.0:
        from traces.transforms import scale_rate
        trace = scale_rate(trace, rate_scale)
    if binned:
        check_span(trace, name)
        check_rate(trace, name)
    return trace, name, arrivals


def store_runs(db: Optional[Path], runs, *, without_steps: set[str] = frozenset()) -> None:
    """Write each distinct run once (analyses share replays); the runs in `without_steps` go
    without their per-step tables (steps, tbt, batches)."""
    if db is None:
        return
    from replay.results.store import write_run
    for r in {r.run_id: r for r in runs}.values():
        tables = r.tables()
        if r.run_id in without_steps:
            tables = {k: v for k, v in tables.items() if k not in ("steps", "tbt", "batches")}
        write_run(db, tables)


def print_flags(console, flags, what: str = "vLLM flags", drop=()) -> None:
    """The `vllm serve` command of `flags` under a heading, on one line of its own whatever the
    terminal's width (soft wrap: no newline is inserted), so that it pastes whole; then the
    deployment's flags it takes away (`drop`: appending `flags` cannot undo them)."""
    from capacity.analyses.flags import serve_command
    console.print(f"{what} (set MODEL to your model):", markup=False, highlight=False)
    console.print(serve_command(flags), soft_wrap=True, markup=False, highlight=False)
    if drop:
        console.print("and leave out of the deployment's flags: " + " ".join(drop),
                      soft_wrap=True, markup=False, highlight=False)


def seconds_text(v: float | None) -> str:
    """Seconds for a terminal table: ms below 1 s, thousands separators, never 1.27e+03."""
    from capacity.units import seconds
    return seconds(v)
