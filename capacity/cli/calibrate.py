"""`kvcap calibrate`: measure the torch stub on a device and write a cost-model profile, or
(`--from-bench`) fit a measured step-time profile to a `vllm bench serve` result."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from capacity.cli.common import emit_json, guarded, trace_flags
from capacity.units import number

err = Console(stderr=True)
# Above this held-out step-time error a stub calibration is not worth using (say so, exit 1).
MAX_STUB_ERROR_PCT = 25.0
# --from-bench must reproduce the bench's median TPOT within this (issue 18), else exit 1.
MAX_BENCH_TPOT_ERROR_PCT = 5.0
# --from-logs: the median per-line error of the replay's running requests above which the fit
# is refused (a line's count is one instant; a few requests either way is the log's scatter).
MAX_LOG_STEP_ERROR_PCT = 15.0


@guarded
@trace_flags
def calibrate_cmd(
    output: Path = typer.Option(..., "-o", "--output", help="Profile JSON to write."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda | cpu (default: cuda when present)."),
    model: str = typer.Option("llama-3.1-8b", "--model", help="Catalog name, HF id or config.json path."),
    gpu: str = typer.Option("h100", "--gpu", help="Catalog GPU for the constants not fitted."),
    stub_shape: Optional[str] = typer.Option(None, "--stub-shape", help="full | tiny (default: full on CUDA, tiny on CPU)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto | fp8."),
    quick: bool = typer.Option(False, "--quick", help="A small grid (seconds; for tests and smoke checks)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    from_bench: Optional[Path] = typer.Option(None, "--from-bench", help="A `vllm bench serve --save-result --save-detailed` JSON: fit the measured profile's overhead and kernel efficiency to it instead of measuring."),
    from_logs: Optional[list[Path]] = typer.Option(None, "--from-logs", help="A vLLM server log with periodic stats lines, from a server that served --trace: fit the measured profile's overhead and kernel efficiency to the logged generation throughput (docs/timing.md)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="--from-logs: the trace the server served."),
    trace_format: Optional[str] = typer.Option(None, "--format", help="--trace's format (default: detected)."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", help="--from-bench/--from-logs: the served TP size."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="--from-bench: the server's value."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", help="--from-bench: the server's value."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="--from-bench: the server's value."),
    max_error_pct: Optional[float] = typer.Option(None, "--max-error-pct", help=f"Refuse (exit 1, nothing written) a fit worse than this: held-out step-time error for the stub (default {MAX_STUB_ERROR_PCT:g}), median-TPOT error for --from-bench (default {MAX_BENCH_TPOT_ERROR_PCT:g}), the median stats line's running-requests error for --from-logs (default {MAX_LOG_STEP_ERROR_PCT:g})."),
) -> None:
    """Measure step shapes with the torch stub and fit the cost model's constants."""
    if from_bench is not None and from_logs:
        raise ValueError("--from-bench and --from-logs: give one of them")
    if from_logs:
        _from_logs(from_logs, trace, trace_format, output, model, gpu, tensor_parallel_size,
                   max_num_seqs, max_num_batched_tokens, max_model_len, kv_cache_dtype, as_json,
                   MAX_LOG_STEP_ERROR_PCT if max_error_pct is None else max_error_pct)
        return
    if from_bench is not None:
        _from_bench(from_bench, output, model, gpu, tensor_parallel_size, max_num_seqs,
                    max_num_batched_tokens, max_model_len, kv_cache_dtype, as_json,
                    MAX_BENCH_TPOT_ERROR_PCT if max_error_pct is None else max_error_pct)
        return
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"--device: {device!r} is not cuda or cpu")
    if stub_shape not in (None, "full", "tiny"):
        raise ValueError(f"--stub-shape: {stub_shape!r} is not full or tiny")
    from replay.calibration.stub_fit import CalibrationOptions, calibrate, write_profile
    opts = CalibrationOptions(device=device, model=model, gpu=gpu, stub_shape=stub_shape,
                              kv_cache_dtype=kv_cache_dtype, quick=quick)
    profile = calibrate(opts, log=None if as_json else (lambda m: err.print(m, highlight=False)))
    heldout, limit = profile["fit"]["mape_heldout_pct"], (
        MAX_STUB_ERROR_PCT if max_error_pct is None else max_error_pct)
    if not heldout <= limit:
        typer.echo(f"kvcap calibrate: the fit's held-out step-time error is {heldout:.1f} % (more "
                   f"than {limit:g} %, --max-error-pct): this device's timings do not fit the cost "
                   "model (a busy or CPU device?); no profile written", err=True)
        raise typer.Exit(1)
    write_profile(profile, output)
    summary = {"profile": str(output), "device": profile["device"], "model": profile["model"],
               "constants": profile["constants"], "fit": profile["fit"],
               "bandwidth": profile["bandwidth"]}
    if as_json:
        emit_json(summary)
        return
    f, bw = profile["fit"], profile["bandwidth"]
    Console().print(f"wrote {output}: held-out step-time error {f['mape_heldout_pct']:.1f} % "
                    f"(train {f['mape_train_pct']:.1f} %, {f['num_train']}+{f['num_heldout']} shapes)")
    for k, v in profile["constants"].items():
        Console().print(f"  {k:<24} {number(v, digits=4)}")
    for k, v in bw.items():
        Console().print(f"  {k:<24} {number(v, digits=4)}")


def _from_bench(path, output, model, gpu, tp, max_num_seqs, max_num_batched_tokens,
                max_model_len, kv_cache_dtype, as_json, limit) -> None:
    from replay.calibration import bench_fit
    from replay.calibration.bench_fit import write_json
    from replay.timing.catalog import get_model
    from replay.config import EngineConfig, resolve
    bench = bench_fit.read_bench(path)
    if model == "llama-3.1-8b" and bench.model_id:
        try:                                  # the bench names the served model: use it
            model = get_model(bench.model_id).name
        except ValueError:
            pass
    config = EngineConfig(model=model, gpu=gpu, tensor_parallel_size=tp,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype)
    base_json, base = _measured_base(resolve(config), "--from-bench")
    fitted, report = bench_fit.fit(bench, config, base,
                                   log=None if as_json else (lambda m: err.print(m, highlight=False)))
    summary = {"profile": str(output), "base": base_json["name"],
               "constants": {"overhead_s": fitted.overhead_s,
                             "kernel_scale": fitted.kernel_scale}, "fit": report}
    bad = not report["median_tpot_error_pct"] <= limit
    if not bad:
        write_json(bench_fit.profile_json(base_json, fitted, report, {"from_bench": bench.path}), output)
    if as_json:
        emit_json({**summary, "written": not bad})
    else:
        Console().print(
            f"{'NOT written' if bad else 'wrote'} {output}: median TPOT replayed "
            f"{report['median_tpot_ms_replayed']:.2f} ms vs observed "
            f"{report['median_tpot_ms_observed']:.2f} ms ({report['median_tpot_error_pct']:.1f} %); "
            f"per-request TPOT error median {report['tpot_median_error_pct']:.1f} % / p90 "
            f"{report['tpot_p90_error_pct']:.1f} %, TTFT median {report['ttft_median_error_pct']:.1f} %"
            f" / p90 {report['ttft_p90_error_pct']:.1f} %; overhead_s {number(fitted.overhead_s, digits=4)}, "
            f"kernel_scale {number(fitted.kernel_scale, digits=4)}")
    if bad:
        typer.echo(f"kvcap calibrate: the fitted profile misses the bench's median TPOT by "
                   f"{report['median_tpot_error_pct']:.1f} % (more than "
                   f"{limit:g} %, --max-error-pct): the engine flags may not match the server's; "
                   "no profile written", err=True)
        raise typer.Exit(1)


def _measured_base(eng, flag: str):
    """The shipped profile a fit starts from: (its JSON, its tables)."""
    import json

    from replay.timing import step_profile
    from replay.timing.executors import shipped_profile
    base = shipped_profile(eng)
    if base is None:
        raise ValueError(f"{flag}: no measured step-time profile for {eng.model.name} on "
                         f"{eng.gpu.name}, tp={eng.tensor_parallel_size}, "
                         f"kv_cache_dtype={eng.config.kv_cache_dtype} to fit "
                         "(docs/timing.md lists the shipped ones)")
    return json.loads(base.read_text(encoding="utf-8")), step_profile.load(base)


def _from_logs(paths, trace_path, trace_format, output, model, gpu, tp, max_num_seqs,
               max_num_batched_tokens, max_model_len, kv_cache_dtype, as_json, limit) -> None:
    from capacity.cli.common import load_trace_file
    from capacity.evidence.logparse import parse_server_log
    from replay.calibration import log_fit
    from replay.calibration.bench_fit import profile_json, write_json
    from replay.config import EngineConfig, resolve
    from replay.run import block_keys, request_state
    if trace_path is None:
        raise ValueError("--from-logs: give --trace, the trace the server served (a log has no "
                         "per-request timings; the fit replays that trace against the log)")
    if len(paths) != 1:
        raise ValueError(f"--from-logs: {len(paths)} files; give the one log of the server that "
                         "served --trace")
    path = Path(paths[0])
    if not path.is_file():
        raise ValueError(f"--from-logs: {path}: no such file")
    with open(path, errors="replace") as f:
        st = parse_server_log(f, path.name, 2000).stats   # the year does not enter the fit
    st = st.filter(st["generation_throughput_tps"].is_not_null() & st["epoch_s"].is_not_null())
    if st.height == 0:
        raise ValueError(f"--from-logs: {path}: no vLLM stats lines ('Avg prompt throughput: "
                         "...') with a timestamp to fit")
    engines = sorted(set(st["engine"].fill_null(0).to_list()))
    if len(engines) > 1:
        raise ValueError(f"--from-logs: {path}: stats of {len(engines)} engines (data parallel); "
                         "the trace's requests were split between them in ways a log does not "
                         "say; calibrate from a single-engine server")
    trace = load_trace_file(trace_path, trace_format=trace_format).sort("arrival_s")
    config = EngineConfig(model=model, gpu=gpu, tensor_parallel_size=tp,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype)
    eng = resolve(config)
    base_json, base = _measured_base(eng, "--from-logs")
    interval = st["interval_s"].fill_null(st["interval_s"].median() or 10.0)
    w = log_fit.StatsWindows(
        end_s=st["epoch_s"].to_numpy(), interval_s=interval.to_numpy(),
        running=st["running"].fill_null(0).to_numpy(),
        generation_tps=st["generation_throughput_tps"].to_numpy(),
        prompt_tps=st["prompt_throughput_tps"].fill_null(0.0).to_numpy())
    fitted, report = log_fit.fit(w, request_state(trace), block_keys(trace, eng.spec.block_size),
                                 config, base,
                                 log=None if as_json else (lambda m: err.print(m, highlight=False)))
    bad = not (report["bracketed"] and report["running_median_error_pct"] <= limit)
    if not bad:
        write_json(profile_json(base_json, fitted, report,
                                {"from_logs": str(path), "trace": str(trace_path)}), output)
    summary = {"profile": str(output), "base": base_json["name"],
               "constants": {"overhead_s": fitted.overhead_s, "kernel_scale": fitted.kernel_scale},
               "fit": report, "written": not bad}
    if as_json:
        emit_json(summary)
    else:
        Console().print(
            f"{'NOT written' if bad else 'wrote'} {output}: trace placed at {report['offset_s']:+.1f} s "
            f"on the log's clock; over {report['num_busy_intervals']} stats lines with requests "
            f"running, the replay runs {report['running_mean_replay']:.2f} on average (log "
            f"{report['running_mean_log']:.2f}; shipped profile off by "
            f"{report['running_sum_error_pct_shipped']:.1f} %), per line median error "
            f"{report['running_median_error_pct']:.1f} %; kernel_scale {number(fitted.kernel_scale, digits=4)} "
            f"(overhead_s {number(fitted.overhead_s, digits=4)} kept)")
    if bad:
        why = ("no kernel_scale in the profile's range makes the replay run as many requests as "
               "the log" if not report["bracketed"] else
               f"the replay's running requests miss the log's by {report['running_median_error_pct']:.1f} "
               f"% at the median stats line (more than {limit:g} %, --max-error-pct)")
        typer.echo(f"kvcap calibrate: {why}: the trace, model, GPU or engine flags may not be the "
                   "server's; no profile written", err=True)
        raise typer.Exit(1)
