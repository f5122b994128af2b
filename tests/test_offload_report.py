"""The V1 host-tier sections of the report, from a hand-made sweep (no replay): the curve renders
offline under Altair's row limit, the knee is marked, the engine and loop are named, and the
migration section puts V0's --swap-space beside V1's --kv-offloading-size."""
import dataclasses

from capacity.analyses.migration import Migration
from capacity.analyses.offload import Knee, OffloadPoint, OffloadSizing, knee
from capacity.report.offload_sections import migration_section, offload_section
from capacity.report.render import render_chart
from capacity.views.charts import chart_rows
from capacity.views.offload_charts import offload_curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def point(size, work, hits, ttft, verdict="ok"):
    return OffloadPoint(kv_offloading_size_gib=size, num_cpu_chunks=int(size * 512),
                        host_ram_gib=size, host_ram_verdict=verdict, cpu_hit_tokens=hits,
                        gpu_hit_tokens=1000, prefill_tokens=work, recomputed_prefill_tokens=50,
                        ttft_p50_s=ttft / 3, ttft_p99_s=ttft, tbt_p99_s=0.04, preemptions=3,
                        preemption_stalls=3, stall_p99_s=0.5, throughput_rps=2.0, run_id=f"r{size}")


def sizing(points) -> OffloadSizing:
    return OffloadSizing(scheduler="v1", scheduler_loop="async", tensor_parallel_size=1,
                         vllm_version="0.34", block_size=64,
                         tolerance=0.05, points=tuple(points), knee=knee(points, 0.05),
                         host_ram_total_gib=256.0, host_ram_source="DGX H100 reference server")


CURVE = [point(0, 10_000, 0, 2.0), point(16, 8_000, 2_000, 1.2), point(32, 7_000, 3_000, 1.01),
         point(64, 6_900, 3_100, 1.0), point(128, 6_900, 3_100, 1.0, "warn")]


def test_offload_section_names_engine_loop_and_knee_and_its_chart_renders():
    z = sizing(CURVE)
    assert z.recommended_kv_offloading_size_gib == 32        # 7,000 <= 1.05 x 6,900; 1.01 <= 1.05
    assert z.flags() == ("--kv-offloading-size", "32", "--kv-offloading-backend", "native")
    sec = offload_section(z)
    assert "vLLM 0.34 (V1, 64-token blocks), async scheduling (the default)" in sec.body
    assert "→ 32.00" in sec.body and "0 (no connector)" in sec.body
    assert "128.00\u00a0GiB (warn)" in sec.body
    (fig,) = sec.charts
    assert chart_rows(fig.chart) < 5000
    svg, png = render_chart(fig.chart)
    assert png.startswith(PNG_MAGIC) and "CPU KV offloading size sweep" in svg
    d = z.as_dict()
    assert d["recommended_kv_offloading_size_gib"] == 32 and d["tolerance"] == 0.05
    assert [p["kv_offloading_size_gib"] for p in d["points"]] == [0, 16, 32, 64, 128]
    assert {"cpu_hit_tokens", "recomputed_prefill_tokens", "ttft_p99_s", "tbt_p99_s"} <= d["points"][0].keys()


def test_flat_curve_recommends_no_connector_in_words():
    z = sizing([point(0, 10_000, 0, 1.0), point(16, 9_900, 100, 0.99)])
    assert not z.needed and z.flags() == ()
    assert z.words().startswith("no CPU offloading")
    offload_curve(z)   # builds with the knee at 0


def test_migration_section_puts_both_answers_side_by_side():
    from types import SimpleNamespace
    v0 = SimpleNamespace(needed=True, recommended_swap_space_gib=2.5, host_ram_gib=2.5,
                         words=lambda: "--swap-space 2.5 GiB per GPU (V0): peak 1.90 GiB")
    m = Migration(replayed="v1", v0=v0, v0_note="", v1=sizing(CURVE), v1_note="")
    sec = migration_section(m)
    assert "V0 --swap-space today" in sec.body and "V1 --kv-offloading-size after migrating" in sec.body
    assert "--swap-space 2.5 GiB per GPU" in sec.body and "--kv-offloading-size 32 GiB" in sec.body
    assert "async scheduling (the default)" in sec.body and "(twin)" in sec.body
    none = dataclasses.replace(m, v0=None, v0_note="V0 twin not sized: overloaded")
    assert "V0 twin not sized: overloaded" in migration_section(none).body
