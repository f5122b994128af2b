"""The capacity report (issue 6, item 3): self-contained HTML that renders offline, one PNG per
chart, summary.json, charts aggregated under Altair's row limit, and a headless-Chromium
screenshot where Chromium exists."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from capacity.views import charts
from capacity.analyses.modes import compare_modes
from capacity.analyses.metrics import nearest_rank
from capacity.report.render import Figure, Section, table, text, write_report
from capacity.analyses.plan import Expected, Recommendation
from capacity.analyses.sizing import size_swap
from capacity.analyses.stability import stability
from replay.config import EngineConfig
from replay.run import replay
from traces.stats import trace_info
from traces.synth import default_trace
from traces.transforms import scale_rate

SECTIONS = ("Recommendation", "Stability", "Workload", "Baseline run", "Swap sizing",
            "Preemption modes", "Latency")
CHROMIUM = Path("/usr/bin/chromium")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def inputs():
    """A small real workload with tiny pools: swap preemptions, a full host pool, recompute."""
    trace = default_trace().head(300)
    base = EngineConfig(scheduler="v0", num_gpu_blocks_override=500)   # V0: the engine with swap
    run = replay(trace, dataclasses.replace(base, preemption_mode="swap",
                                            on_swap_full="recompute", num_cpu_blocks_override=100))
    # Sizing refuses an overloaded run (this one is: the pool is tiny); measure it on a larger
    # pool at 0.3x the rate, which keeps up and still swaps.
    sizing = size_swap(scale_rate(trace, 0.3), dataclasses.replace(base, num_gpu_blocks_override=900),
                       sweep_fractions=(0.5, 1.0))
    modes = compare_modes(trace, base)
    rec = recommendation(("--preemption-mode", "swap", "--swap-space", "1"))
    return dict(trace=trace, run=run, sizing=sizing, modes=modes, rec=rec,
                stab=stability(run.tables()))


def recommendation(flags, sustainable=True) -> Recommendation:
    exp = Expected(run_id="r", ttft_p99_s=0.5, tbt_p99_s=0.05, preemptions=3, throughput_rps=2.0,
                   goodput_rps=1.5, slo_share=0.75, meets_slo=True, within_budget=True,
                   breaks="") if sustainable else None
    return Recommendation(verdict="fits" if sustainable else "overloaded",
                          sustainable=sustainable, offered_rps=2.0, served_rps=2.0,
                          sustainable_rate_scale=None, headroom_rate_scale=1.5 if sustainable else None,
                          capacity_rps=3.0 if sustainable else None,
                          precision=0.05, flags=tuple(flags), expected=exp, config=None,
                          headline="headline", lines=("a note with `code` & <tags>",))


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    extra = Section(title="Extra <analysis>",
                    body=text("a & b") + table([["k", 1.5]], ["key", "v"]),
                    charts=(Figure("extra_ttft", charts.ttft_cdf(inputs["run"].requests),
                                   caption="again"),))
    index = write_report(out, title="test report <1>", trace_summary=trace_info(inputs["trace"]),
                         run=inputs["run"], sizing=inputs["sizing"], modes=inputs["modes"],
                         recommendation=inputs["rec"], stability=inputs["stab"],
                         extra_sections=[extra])
    return index


def test_index_has_every_section_and_the_flags(report):
    html = report.read_text()
    assert report.name == "index.html"
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in html
    assert 'vllm serve "$MODEL" \\\n' in html.replace("&quot;", '"')
    assert "  --preemption-mode swap \\\n  --swap-space 1" in html
    assert html.count("<img ") == len(json.loads((report.parent / "summary.json").read_text())
                                      ["charts"])


def test_baseline_says_which_engine_and_loop_it_replayed(report, inputs):
    from capacity.report.render import engine_words
    words = engine_words(inputs["run"].run)
    # the fixture swaps: V0
    assert words == "vLLM 0.10.1.1 (V0, 16-token blocks), synchronous engine loop"
    assert words in report.read_text()
    assert engine_words({"scheduler": "v1", "async_scheduling": True, "vllm_version": "0.34",
                         "block_size": 64}) == \
        "vLLM 0.34 (V1, 64-token blocks), async scheduling (the default)"
    assert "--no-async-scheduling" in engine_words({"scheduler": "v1", "async_scheduling": False})


def test_text_is_escaped(report):
    html = report.read_text()
    assert "<h2>Extra &lt;analysis&gt;</h2>" in html
    assert "test report &lt;1&gt;" in html
    assert "a note with <code>code</code> &amp; &lt;tags&gt;" in html
    assert "<tags>" not in html


def test_report_loads_nothing_from_the_network(report):
    html = report.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", html, re.I)
    assert not re.search(r"<link[^>]*\bhref=", html, re.I)
    assert "http://" not in html and "https://" not in html
    assert "@import" not in html and "url(" not in html


def test_one_valid_png_per_chart(report):
    names = json.loads((report.parent / "summary.json").read_text())["charts"]
    assert {"load_and_queues.png", "kv_usage.png", "preemptions_per_minute.png",
            "swapped_gib.png", "host_size_sweep.png", "ttft_cdf.png", "tbt_cdf.png",
            "mode_comparison.png", "extra_ttft.png"} == set(names)
    for name in names:
        data = (report.parent / name).read_bytes()
        assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
        w, h = struct.unpack(">II", data[16:24])
        assert w >= 300 and h >= 200, name


def test_summary_json_has_the_expected_keys(report, inputs):
    doc = json.loads((report.parent / "summary.json").read_text())
    assert {"title", "sustainable", "offered_rps", "served_rps", "headroom_rate_scale",
            "recommendation", "stability", "trace", "run", "sizing", "modes", "sections",
            "charts"} <= set(doc)
    assert doc["recommendation"]["flags"] == ["--preemption-mode", "swap", "--swap-space", "1"]
    assert {"ttft_p99_s", "tbt_p99_s", "preemptions"} <= set(doc["recommendation"]["expected"])
    assert doc["run"]["run_id"] == inputs["run"].run_id
    assert doc["run"]["preemptions_swap"] > 0
    assert doc["sizing"]["recommended_swap_space_gib"] == \
        inputs["sizing"].recommended_swap_space_gib
    assert doc["modes"]["recommended"] == inputs["modes"].recommended
    assert doc["trace"]["requests"] == 300
    assert doc["sections"][:7] == list(SECTIONS)


def test_report_without_sizing_or_modes(inputs, tmp_path):
    index = write_report(tmp_path, title="baseline only", trace_summary={"requests": 300},
                         run=inputs["run"], sizing=None, modes=None,
                         recommendation=recommendation((), sustainable=False),
                         stability=inputs["stab"])
    html = index.read_text()
    assert html.count("Not derived: the baseline is overloaded") == 2
    assert "No flags: the run is overloaded" in html
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["sizing"] is None and doc["modes"] is None
    assert not (tmp_path / "mode_comparison.png").exists()


def test_chart_names_must_be_unique(inputs, tmp_path):
    dup = Section(title="dup", charts=(Figure("tbt_cdf", charts.tbt_cdf(inputs["run"].tbt)),))
    with pytest.raises(ValueError, match="tbt_cdf"):
        write_report(tmp_path, title="t", trace_summary={}, run=inputs["run"], sizing=None,
                     modes=None, recommendation=inputs["rec"], stability=inputs["stab"],
                     extra_sections=[dup])


# ---- charts stay under Altair's 5000-row limit ----------------------------------------------

def _long_run(seconds: float = 86_400.0, steps: int = 300_000) -> tuple[pl.DataFrame, ...]:
    """A day of fake steps, arrivals, events and 1M weighted TBT samples."""
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, seconds, steps))
    n = rng.integers(0, 300, steps)
    st = pl.DataFrame({"start_s": t, "duration_s": np.full(steps, 0.02), "num_running": n,
                       "num_waiting": n // 2, "num_swapped": n // 10, "gpu_blocks_used": n * 10,
                       "cpu_blocks_used": n, "evicted_blocks": n, "evicted_requests": n // 10})
    req = pl.DataFrame({"arrival_s": np.sort(rng.uniform(0, seconds, 200_000)),
                        "first_token_s": None, "status": "finished"}).with_columns(
        first_token_s=pl.col("arrival_s") + rng.exponential(0.5, 200_000))
    ev = pl.DataFrame({"t_s": rng.uniform(0, seconds, 50_000),
                       "kind": rng.choice(["preempt_recompute", "preempt_swap", "swap_in"],
                                          50_000)})
    tbt = pl.DataFrame({"tbt_s": rng.exponential(0.03, 1_000_000),
                        "weight": rng.integers(1, 50, 1_000_000)})
    return st, req, ev, tbt


def test_charts_aggregate_large_inputs_below_the_row_limit(inputs):
    st, req, ev, tbt = _long_run()
    run = {"num_gpu_blocks": 3000, "num_cpu_blocks": 300, "kv_bytes_per_block": 2 ** 21,
           "sim_seconds": 86_400.0}
    demand = pl.DataFrame({"t_s": np.arange(86_400, dtype=np.float64),
                           "gib": np.random.default_rng(1).uniform(0, 3, 86_400),
                           "requests": np.zeros(86_400, dtype=np.int64)})
    made = [charts.load_and_queues(req, st, 86_400.0), charts.kv_usage(st, run),
            charts.preemptions(ev, 86_400.0), charts.ttft_cdf(req), charts.tbt_cdf(tbt),
            charts.swapped_gib(demand, recommended_gib=4.0, peak_gib=3.0, peak_at_s=100.0),
            charts.host_size_sweep([*inputs["sizing"].sweep, *inputs["sizing"].what_if],
                                   recommended_gib=1.0, peak_gib=0.5),
            charts.mode_comparison(inputs["modes"].table(), "swap")]
    for chart in made:
        assert 0 < charts.chart_rows(chart) <= charts.MAX_ROWS


def test_binning_keeps_totals():
    st, req, ev, _ = _long_run(3600.0, 20_000)
    arr, queues, bin_s = charts.load_frames(req, st, 3600.0)
    assert arr["rps"].sum() * bin_s == pytest.approx(req.height)
    assert queues.filter(pl.col("queue") == "running")["requests"].max() == st["num_running"].max()
    pre, per = charts.preemption_frame(ev, 3600.0)
    n_pre = ev.filter(pl.col("kind").str.starts_with("preempt_")).height
    assert per == 1 and pre.filter(pl.col("mode") == "swap")["y1"].max() <= n_pre
    assert (pre.filter(pl.col("mode") == "swap")["y1"].sum()) == n_pre


def test_cdf_points_are_nearest_rank_quantiles():
    rng = np.random.default_rng(2)
    v, w = rng.exponential(0.03, 10_000), rng.integers(1, 20, 10_000)
    pts = charts.cdf_points(v, w)
    assert pts.height <= charts.CDF_POINTS + 10
    assert pts["value_s"].is_sorted() and pts["fraction"].is_sorted()
    for q in (0.5, 0.99, 0.999):
        at = pts.filter(pl.col("fraction") >= q - 1e-12)["value_s"][0]
        assert at == nearest_rank(v, q, w)
    assert pts["value_s"].max() == v.max()


# ---- renders in a headless browser without network ------------------------------------------

def _png_pixels(path: Path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) into (h, w, c).

    Unfilters along anti-diagonals so that each numpy step handles many pixels at once."""
    data = path.read_bytes()
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I", data[pos:pos + 4])[0], data[pos + 4:pos + 8]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", data[pos + 8:pos + 21])
        elif kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, ihdr
    c = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, w * c + 1)
    ftype, filt = raw[:, 0].astype(np.int32), raw[:, 1:].reshape(h, w, c).astype(np.int32)
    rec = np.zeros((h + 1, w + 1, c), np.int32)        # row 0 and column 0 stay zero
    for d in range(h + w - 1):
        r = np.arange(max(0, d - w + 1), min(h - 1, d) + 1)
        x = d - r
        a, b, cc = rec[r + 1, x], rec[r, x + 1], rec[r, x]
        p = a + b - cc
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - cc)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, cc))
        t = ftype[r][:, None]
        pred = np.select([t == 0, t == 1, t == 2, t == 3], [0, a, b, (a + b) // 2], paeth)
        rec[r + 1, x + 1] = (filt[r, x] + pred) % 256
    return rec[1:, 1:, :3].astype(np.uint8)


def test_renders_in_headless_chromium_without_network(report, tmp_path):
    if not CHROMIUM.exists() and not shutil.which("chromium"):
        pytest.skip("no Chromium here (apt-get install chromium) - the screenshot check needs it")
    exe = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    shot = tmp_path / "shot.png"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
           "--window-size=1200,3000", report.resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert shot.exists(), "Chromium wrote no screenshot"
    px = _png_pixels(shot)
    assert px.shape[:2] == (3000, 1200)
    packed = (px[..., 0].astype(np.int64) << 16) | (px[..., 1].astype(np.int64) << 8) | px[..., 2]
    colours = np.unique(packed)
    assert len(colours) > 50                               # text, tables and charts, not blank
    assert (packed != 0xFFFFFF).mean() > 0.05              # more than a few lines of ink
    chart_colours = {int(charts.COLORS[k][1:], 16) for k in ("running", "waiting", "swapped")}
    assert len(chart_colours & set(colours.tolist())) >= 2  # the chart images were drawn


def test_flags_that_miss_the_slos_are_not_offered_as_advice(inputs):
    """A sustainable run whose best configuration still misses the SLOs quotes its flags (they
    reproduce the replay) but does not tell the reader to append them."""
    from capacity.report.render import recommendations_section
    ok = recommendation(("--max-num-seqs", "256"))
    miss = dataclasses.replace(ok, verdict="misses",
                               expected=dataclasses.replace(ok.expected, meets_slo=False))
    ok_html = recommendations_section(ok, inputs["stab"]).body
    miss_html = recommendations_section(miss, inputs["stab"]).body
    assert "Serve with these flags" in ok_html and "MISSES the SLOs" not in ok_html
    assert "Serve with these flags" not in miss_html and "MISSES the SLOs" in miss_html
    assert "--max-num-seqs 256" in miss_html
