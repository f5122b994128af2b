"""Writes notebooks/*.ipynb (outputs stripped) from the cell lists below; run after editing them:

    .venv/bin/python notebooks/build.py

Notebooks stay thin (DESIGN §8, STYLE): imports, one cell tagged `parameters` (papermill), then
calls into the packages ending in a chart or a small table. No `def`/`class`, no loops;
tests/test_notebooks.py checks that and executes every notebook headless. Cell ids are derived from
the notebook name and position, so rebuilding an unchanged list gives identical files.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

# ---- shared cell text ------------------------------------------------------------------------

TRACE_PARAMS = '''\
trace_path = None             # a trace file (CSV, JSONL, Parquet; BurstGPT, Azure, Mooncake...); None = built-in scenario
trace_format = None           # None = detect from the file
scenario = "flash-crowd"      # the built-in scenario used when trace_path is None
scenario_params = {"duration_s": 240, "rate_rps": 4.0, "surge_start_s": 90, "ramp_s": 20,
                   "hold_s": 60, "decay_s": 30}
window_s = None               # [start, end] seconds: keep a slice of a long trace
db_path = "kvcap-notebooks.duckdb"   # shared by all notebooks: later ones reuse stored runs'''

ENGINE_PARAMS = '''\
scheduler = "v1"              # "v0" (vLLM <= 0.10) or "v1"
model = "llama-3.1-8b"
gpu = "h100"
num_gpu_blocks_override = 2500   # a small KV pool so that the surge preempts; None = from GPU memory
max_num_seqs = None           # None = vLLM's default for the version and GPU'''

LOAD_TRACE = '''\
trace = nbviews.notebook_trace(trace_path, trace_format, scenario=scenario,
                               scenario_params=scenario_params, window_s=window_s)'''

CONFIG = '''\
config = EngineConfig(scheduler=scheduler, model=model, gpu=gpu, max_num_seqs=max_num_seqs,
                      num_gpu_blocks_override=num_gpu_blocks_override{extra})
config'''


SETUP = ('# Offline charts as PNG images: no CDN, and JupyterLab shows them even in a notebook it does\n'
         '# not trust (it hides untrusted SVG output); "svg" works too when you run it yourself.\n'
         'alt.renderers.enable("png", scale_factor=2)\n'
         "pl.Config.set_tbl_rows(40).set_fmt_str_lengths(100).set_tbl_hide_dataframe_shape(True);")


def params(*parts: str) -> str:
    return "\n".join(parts)


# ---- the notebooks ---------------------------------------------------------------------------
# Each entry: (kind, text); kind "md", "code" or "params" (the papermill parameters cell).

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {}

NOTEBOOKS["01-explore-trace"] = [
    ("md", "# 01 · Explore a trace\n\n"
           "**Question:** what does the traffic look like before anything is replayed? Arrival rate "
           "over time and its peaks, prompt and output length distributions, priorities and "
           "tenants, and prefix reuse (traces with prefix hashes, e.g. Mooncake).\n\n"
           "Set `trace_path` to a file of yours, or keep the built-in flash-crowd scenario (a "
           "4-minute slice by default)."),
    ("params", TRACE_PARAMS),
    ("code", "import altair as alt\nimport polars as pl\n\nfrom capacity.views import notebook as nbviews\nfrom traces.stats import trace_info\n\n"
             + SETUP),
    ("code", LOAD_TRACE + "\ninfo = trace_info(trace)\nnbviews.trace_table(info)"),
    ("md", "## Arrival rate and peaks\n\nRequests per second (mean per bin) and the token rate "
           "they bring. `peak_60s` above is the most requests in any 60-second window."),
    ("code", "nbviews.arrivals_chart(trace)"),
    ("md", "## Length distributions\n\nLog-spaced bins: the long tail of prompts and outputs is "
           "what fills the KV cache."),
    ("code", "nbviews.lengths_chart(trace)"),
    ("md", "## Priorities, tenants and prefix reuse"),
    ("code", 'nbviews.kv_table({"priorities": info["priorities"], "tenants": info["tenants"]})'),
    ("code", "nbviews.prefix_table(info)"),
    ("md", "## Runs stored so far\n\nThe later notebooks store their replays in `db_path`; a "
           "replay of the same trace and config is read back instead of run again."),
    ("code", "nbviews.runs_table(db_path)"),
]

NOTEBOOKS["02-replay-and-preemption"] = [
    ("md", "# 02 · Replay and preemption\n\n"
           "**Question:** what happens inside the engine under this traffic? One replay through "
           "the exact vLLM scheduler model: running / waiting / swapped requests and KV usage "
           "over time, preemptions per minute, and the TBT spikes that preemption stalls cause "
           "(and the ones it does not). Ends with the verdict — none, peak-only or structural — "
           "and the matching Prometheus alert rule."),
    ("params", params(TRACE_PARAMS, ENGINE_PARAMS,
                      'preemption_mode = "recompute"   # recompute | swap | none (queue only)')),
    ("code", "import altair as alt\nimport polars as pl\n\nfrom capacity.views import charts, notebook as nbviews\n"
             "from capacity.analyses.classify import alert_rule, classify\nfrom capacity.analyses.metrics import summary\n"
             "from capacity.analyses.stability import stability\n"
             "from capacity.analyses.stalls import attribute_stalls\nfrom replay.config import EngineConfig\n\n"
             + SETUP),
    ("code", LOAD_TRACE + "\n" + CONFIG.format(extra=", preemption_mode=preemption_mode")),
    ("md", "## The replay\n\nRead back from `db_path` when this trace and config were replayed "
           "before (the run id is a hash of both), else replayed and stored."),
    ("code", 'tables = nbviews.cached_replay(db_path, trace, config, label="02 replay")\n'
             'run = tables["runs"].row(0, named=True)\nnbviews.kv_table(summary(tables))'),
    ("md", "## Does the engine keep up?\n\nStability first: an overloaded replay (the waiting "
           "queue grows for good) says nothing about swap sizes or alert thresholds."),
    ("code", "stable = stability(tables)\nprint(stable.evidence)\nnbviews.kv_table(stable.as_dict())"),
    ("md", "## Queues and KV usage over time"),
    ("code", 'charts.load_and_queues(tables["requests"], tables["steps"], run["sim_seconds"])'),
    ("code", 'charts.kv_usage(tables["steps"], run)'),
    ("md", "## Preemptions per minute"),
    ("code", 'charts.preemptions(tables["events"], run["sim_seconds"])'),
    ("md", "## Stalls lined up with TBT spikes\n\nA preemption stall is the TBT sample that spans "
           "a preemption. Spikes without a stall under them come from long steps (large prefill "
           "chunks, swap traffic) — a `--max-num-batched-tokens` question, not a KV one."),
    ("code", "stalls = attribute_stalls(tables)\nprint(stalls.summary)\n"
             "nbviews.stalls_chart(tables, stalls.threshold_s)"),
    ("code", 'charts.tbt_cdf(tables["tbt"])'),
    ("code", 'charts.ttft_cdf(tables["requests"])'),
    ("md", "## Peak-only or structural?"),
    ("code", "verdict = classify(tables)\nprint(verdict.verdict, \"—\", verdict.evidence)\n"
             "print(alert_rule(tables).yaml if stable.sustainable else \"overloaded: no alert rule\")"),
]

NOTEBOOKS["03-swap-space-sizing"] = [
    ("md", "# 03 · Swap space sizing\n\n"
           "**Question:** how much host memory does the swap tier need (`--swap-space` on V0, "
           "`--kv-offloading-size` on V1)? A replay with a host pool too big to fill measures the "
           "demand — the KV of all requests swapped out at the same moment — then the "
           "recommendation (peak × (1 + headroom)) is verified by replaying with it, and what-if "
           "replays show what a smaller pool does (abort, or fall back to recompute). Last: is a "
           "swap tier worth it at all, against recompute and queue-only?"),
    ("params", params(TRACE_PARAMS, ENGINE_PARAMS,
                      "headroom = 0.2                # recommended = peak x (1 + headroom), rounded up to 0.5 GiB",
                      "what_if_fraction = 0.75       # what-if replays at this fraction of the measured peak",
                      "sweep_fractions = [0.5, 1.0]  # host sizes (fractions of the peak) for the sweep chart",
                      "workers = 1                   # parallel replays (processes)")),
    ("code", "import altair as alt\nimport polars as pl\n\nfrom capacity.views import charts, notebook as nbviews\n"
             "from capacity.analyses.modes import compare_modes\nfrom capacity.analyses.planner import Planner\n"
             "from capacity.analyses.sizing import size_swap\n"
             "from replay.config import EngineConfig\n\n"
             + SETUP),
    ("code", LOAD_TRACE + "\n" + CONFIG.format(extra="")),
    ("md", "## Demand and recommendation"),
    ("code", "planner = Planner(workers=workers)\n"
             "sizing = size_swap(trace, config, headroom=headroom, what_if_fraction=what_if_fraction,\n"
             "                   sweep_fractions=tuple(sweep_fractions), planner=planner)\n"
             "stored = nbviews.store_runs(db_path, planner.runs)\nprint(sizing.words())\nnbviews.kv_table(sizing)"),
    ("code", "charts.swapped_gib(sizing.demand, recommended_gib=sizing.recommended_swap_space_gib,\n"
             "                   peak_gib=sizing.peak_swapped_gib, peak_at_s=sizing.peak_at_s)"),
    ("md", "## Verification and what-if replays\n\n`abort` is what vLLM V0 does when the host "
           "pool is full; `recompute` falls back to recomputing the victim."),
    ("code", "checks = [sizing.verify, *sizing.what_if, *sizing.sweep] if sizing.verify else []\n"
             "charts.sweep_frame(checks)"),
    ("code", "charts.host_size_sweep(checks, recommended_gib=sizing.recommended_swap_space_gib,\n"
             "                       peak_gib=sizing.peak_swapped_gib)"),
    ("md", "## Swap vs. recompute vs. queue-only"),
    ("code", "comparison = compare_modes(trace, config, planner=planner,\n"
             "                           swap_space_gib=sizing.recommended_swap_space_gib if sizing.needed else None)\n"
             "stored = nbviews.store_runs(db_path, planner.runs)\n"
             "print(comparison.recommended, \"—\", comparison.reason)\nprint(comparison.queue_only_note)\n"
             "charts.mode_comparison(comparison.table(), comparison.recommended)"),
]

NOTEBOOKS["04-max-num-seqs"] = [
    ("md", "# 04 · Tuning `--max-num-seqs`\n\n"
           "**Question:** which `--max-num-seqs` gives the most goodput while meeting the TTFT / "
           "TBT SLOs and a preemption budget — and how much more traffic does it absorb? One "
           "replay per grid point; among the feasible values the one with the largest *margin* "
           "(the highest multiple of today's rate at which it still meets the SLOs, searched by "
           "bisection) is recommended. Its margin is the headroom: the same search, the same "
           "number as `kvcap report` and `kvcap headroom`."),
    ("params", params(TRACE_PARAMS, ENGINE_PARAMS,
                      "max_num_seqs_grid = [16, 32, 64, 128]",
                      "slo_ttft_p99_s = 2.0",
                      "slo_tbt_p99_s = 0.2",
                      "budget_minutes_share = 0.5    # preemption allowed in at most this share of minutes",
                      "budget_per_minute = None      # and at most this many in any minute (None = no limit)",
                      "precision = 0.05              # of the margin / headroom search",
                      "workers = 1                   # parallel replays (processes)")),
    ("code", "import altair as alt\nimport polars as pl\n\nfrom capacity.views import notebook as nbviews\n"
             "from capacity.analyses.headroom import headroom\nfrom capacity.analyses.planner import Planner\n"
             "from capacity.analyses.tuning import Budget, tune\n"
             "from replay.config import EngineConfig\n\n"
             + SETUP),
    ("code", LOAD_TRACE + "\n" + CONFIG.format(extra="")),
    ("md", "## The sweep"),
    ("code", "planner = Planner(workers=workers)\n"
             "budget = Budget(peak_only=False, max_minutes_share=budget_minutes_share, max_per_minute=budget_per_minute)\n"
             "tuning = tune(trace, config, max_num_seqs_grid=max_num_seqs_grid, slo_ttft_p99_s=slo_ttft_p99_s,\n"
             "              slo_tbt_p99_s=slo_tbt_p99_s, budget=budget, planner=planner, precision=precision)\n"
             "stored = nbviews.store_runs(db_path, planner.runs)\n"
             'tuning.table().select("max_num_seqs", "margin_rate_scale", "goodput_rps", "slo_share", "ttft_p99_s",\n'
             '                      "tbt_p99_s", "preempted_minutes_share", "feasible", "breaks")'),
    ("md", "## SLO and budget frontier"),
    ("code", "nbviews.tuning_chart(tuning)"),
    ("md", "## Recommendation"),
    ("code", "print(tuning.explanation)\nprint(\" \".join(tuning.flags))"),
    ("md", "## Headroom of the recommended config"),
    ("code", "tuned = tuning.recommended_config or config\n"
             "hr = headroom(trace, tuned, planner, slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s,\n"
             "              budget=budget, precision=precision)\n"
             "stored = nbviews.store_runs(db_path, planner.runs)\n"
             "print(\"headroom_rate_scale:\", hr.headroom_rate_scale, \"—\", hr.explanation)\n"
             "nbviews.headroom_chart(hr)"),
]

NOTEBOOKS["05-priority-and-fairness"] = [
    ("md", "# 05 · Priority and fairness\n\n"
           "**Question:** when interactive chat and offline batch jobs share an instance under "
           "`--scheduling-policy priority`, who yields? The same trace is replayed shared with "
           "preemption, shared queue-only (what it costs not to preempt), and with the "
           "interactive traffic alone (what the batch traffic costs it)."),
    ("params", params(TRACE_PARAMS.replace('"flash-crowd"     ', '"priority-mix"    ').replace(
        '{"duration_s": 240, "rate_rps": 4.0, "surge_start_s": 90, "ramp_s": 20,\n'
        '                   "hold_s": 60, "decay_s": 30}',
        '{"duration_s": 180, "rate_rps": 3.0, "batch_job_interval_s": 60,\n'
        '                   "batch_job_requests": 80}'), ENGINE_PARAMS,
        "workers = 1                   # parallel replays (processes)")),
    ("code", "import altair as alt\nimport polars as pl\n\nfrom capacity.views import notebook as nbviews\n"
             "from capacity.analyses.planner import Planner\nfrom capacity.analyses.priority import interference\n"
             "from replay.config import EngineConfig\n\n"
             + SETUP),
    ("code", LOAD_TRACE + "\n" + CONFIG.format(extra="")),
    ("md", "## The traffic, by tenant\n\nWith a trace file, map priorities first "
           "(`traces.transforms.priority_from_column` and friends)."),
    ("code", 'nbviews.arrivals_chart(trace, by="tenant")'),
    ("md", "## Who yields"),
    ("code", "planner = Planner(workers=workers)\ninter = interference(trace, config, planner=planner)\n"
             "stored = nbviews.store_runs(db_path, planner.runs)\nprint(inter.summary)\ninter.by_class"),
    ("code", "nbviews.priority_chart(inter)"),
]

NOTEBOOKS["06-production-evidence"] = [
    ("md", "# 06 · Production evidence\n\n"
           "**Question:** what do the production logs and client timings say, and does the replay "
           "agree? vLLM server logs and client benchmark results go into the same DuckDB: the "
           "logged stats over time, client TBT spikes lined up with logged preemptions, the swap "
           "size from the observed peaks, and the replay against the logged time series.\n\n"
           "The defaults use the fixtures in `tests/data/logs` (a V0 server log and a `vllm bench "
           "serve` result of the same two minutes) and a stand-in trace; point `log_files` and "
           "`trace_path` at your own."),
    ("params", params(
        'log_files = ["../tests/data/logs/v0_server.log", "../tests/data/logs/bench_v0.json"]',
        'server_log = "v0_server.log"    # the server log (file name) to analyse',
        'client_file = "bench_v0.json"   # the client results (file name)',
        "log_year = 2025               # vLLM prints no year in its timestamps",
        "offset_s = 0.0                # replay t = 0 is this long after the first stats line",
        TRACE_PARAMS.replace('"flash-crowd"     ', '"poisson"         ').replace(
            '{"duration_s": 240, "rate_rps": 4.0, "surge_start_s": 90, "ramp_s": 20,\n'
            '                   "hold_s": 60, "decay_s": 30}',
            '{"duration_s": 120, "rate_rps": 2.5}'),
        'scheduler = "v0"              # the production engine of the log',
        'model = "llama-3.1-8b"',
        'gpu = "h100"',
        "num_gpu_blocks_override = 2048   # '# GPU blocks: 2048' in the log",
        "max_num_seqs = None",
        "swap_space = 4.0              # GiB per GPU, as production ran it")),
    ("code", "import altair as alt\nimport polars as pl\n\nfrom capacity.views import evidence as evidence_charts, notebook as nbviews\n"
             "from capacity.evidence.attribute import attribute\nfrom capacity.evidence.logs import ingest, read_evidence\n"
             "from capacity.evidence.logs_swap import size_swap_from_logs\nfrom capacity.evidence.validate import validate\n"
             "from replay.config import EngineConfig\n\n"
             + SETUP),
    ("md", "## Load the evidence"),
    ("code", "ingested, year, year_source = ingest(log_files, db_path, year=log_year)\n"
             "nbviews.ingested_table(ingested)"),
    ("md", "## Logged stats over time"),
    ("code", 'evidence = read_evidence(db_path, "log_stats", "log_preemptions")\n'
             'nbviews.log_stats_chart(evidence["log_stats"], server_log)'),
    ("md", "## Client TBT spikes vs. logged preemptions\n\nA spike is a client inter-token gap "
           "above 5 × the median; each is matched against preemption warnings and stats lines "
           "around it."),
    ("code", "spikes = attribute(db_path, server=server_log, client=client_file)\nprint(spikes.verdicts)\n"
             'spikes.table.select("spike_time", "request_id", "itl_s", "verdict", "mode", "evidence")'),
    ("code", "evidence_charts.attribution_chart(spikes)"),
    ("md", "## Swap size from the observed peaks\n\nCompared with the replay-based answer when "
           "notebook 03 stored one in the same DuckDB."),
    ("code", LOAD_TRACE + "\n" + CONFIG.format(extra=",\n                      preemption_mode=\"swap\", swap_space=swap_space")),
    ("code", "from_logs = size_swap_from_logs(db_path, config)\nprint(from_logs.difference)\n"
             "nbviews.kv_table(from_logs)"),
    ("md", "## Replay vs. production\n\nThe replay resampled at the log's stats intervals; error "
           "per metric, and client TTFT / ITL percentiles against the replay's."),
    ("code", 'tables = nbviews.cached_replay(db_path, trace, config, label="06 replay vs production")\n'
             'check = validate(db_path, tables["runs"]["run_id"][0], offset_s=offset_s, source=server_log,\n'
             "                 client=client_file)\nnbviews.validation_table(check)"),
    ("code", "nbviews.validation_chart(check)"),
]


def cell(stem: str, i: int, kind: str, text: str):
    c = new_markdown_cell(text) if kind == "md" else new_code_cell(text)
    if kind == "params":
        c.metadata["tags"] = ["parameters"]
    c["id"] = f"{stem[:2]}-{i:02d}"
    return c


def build(stem: str, cells: list[tuple[str, str]]):
    nb = new_notebook(cells=[cell(stem, i, k, t) for i, (k, t) in enumerate(cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(out: Path = HERE) -> list[Path]:
    paths = []
    for stem, cells in NOTEBOOKS.items():
        nb = build(stem, cells)
        nbformat.validate(nb)
        path = out / f"{stem}.ipynb"
        nbformat.write(nb, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
