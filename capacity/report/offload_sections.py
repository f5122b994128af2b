"""Report sections of the host tier on vLLM V1: the CPU offloading sweep, and the migration
("V0 `--swap-space` today → V1 `--kv-offloading-size` after migrating") side by side.

Built from `Plan.offload` / `Plan.migration` (capacity.analyses.offload, .migration); each names
the engine and loop it replayed. Must not replay anything.
"""
from __future__ import annotations

from capacity.analyses.migration import Migration
from capacity.analyses.offload import OffloadSizing
from capacity.report.render import NOT_DERIVED, Figure, Section, gib, pct, seconds, table, text
from capacity.views.offload_charts import offload_curve


def point_rows(z: OffloadSizing) -> list[list]:
    rec = z.knee.index
    return [[("→ " if i == rec else "") + (gib(p.kv_offloading_size_gib) if p.kv_offloading_size_gib
                                           else "0 (no connector)"),
             f"{p.num_cpu_chunks:,}", f"{p.cpu_hit_tokens:,}", f"{p.prefill_tokens:,}",
             f"{p.recomputed_prefill_tokens:,}", seconds(p.ttft_p50_s), seconds(p.ttft_p99_s),
             seconds(p.tbt_p99_s), f"{p.preemption_stalls:,}", seconds(p.stall_p99_s),
             gib(p.host_ram_gib) + (f" ({p.host_ram_verdict})" if p.host_ram_verdict else "")]
            for i, p in enumerate(z.points)]


POINT_HEADER = ["--kv-offloading-size", "CPU chunks", "CPU-hit tokens", "prefill computed",
                "recomputed prefill", "TTFT p50", "TTFT p99", "TBT p99", "preemption stalls",
                "stall p99", "host RAM pinned"]


def offload_section(z: OffloadSizing | None, note: str = NOT_DERIVED) -> Section:
    """`note`: what the section says without a sizing (overloaded, or not sized)."""
    if z is None:
        return Section(title="CPU offloading sizing", anchor="offload-sizing", body=text(note))
    body = (text(f"vLLM V1's `--kv-offloading-size` (0.33 and 0.34) is a write-through second prefix cache: "
                 f"its size sets how much prefill a request loads from the host instead of "
                 f"recomputing, not whether a preemption can happen. The trace was replayed on "
                 f"{z.engine_words()} at each size below (from 1/16 of the GPU KV pool, then halved "
                 f"and bisected towards the knee); the recommendation is the smallest "
                 f"size within {pct(z.tolerance)} of the best on prefill work and TTFT p99"
                 + (", among the sizes the host can pin: the host-RAM cap binds, not the knee."
                    if z.knee.unconstrained_gib is not None else ".")
                 + f" Where the gain comes from: {z.gain_words()}.")
            + text(f"Recommended: {z.words()}.")
            + text(f"Host RAM: {z.host_ram_source}"
                   + (f" = {gib(z.host_ram_total_gib)}" if z.host_ram_total_gib else "")
                   + "; kvcap warns above 40% and flags above 70% pinned (V0's swap-space "
                     "rule; vLLM V1 does not check).")
            + table(point_rows(z), POINT_HEADER))
    return Section(title="CPU offloading sizing", anchor="offload-sizing", body=body,
                   charts=(Figure("offload_curve", offload_curve(z)),))


def migration_section(m: Migration | None) -> Section | None:
    if m is None:
        return None
    v0 = m.v0
    v1 = m.v1
    v0_answer = (f"--swap-space {v0.recommended_swap_space_gib:g} GiB per GPU" if v0 and v0.needed
                 else "no swap pool needed" if v0 else "—")
    v1_answer = ((f"--kv-offloading-size {v1.recommended_kv_offloading_size_gib:g} GiB"
                  if v1.needed else "no CPU offloading") if v1 else "—")
    rows = [
        ["engine replayed", "vLLM 0.10.1.1 (V0), synchronous loop" + (" (twin)" if m.replayed == "v1" else ""),
         (v1.engine_words() if v1 else "vLLM V1") + (" (twin)" if m.replayed == "v0" else "")],
        ["what the host tier is", "swap space: holds requests swapped out at preemption",
         "CPU KV offloading: a write-through second prefix cache"],
        ["sized by", "peak concurrently swapped-out KV × (1 + headroom), verified by replay",
         "the knee of the size sweep (prefill work, TTFT p99)"],
        ["recommended flag", v0_answer, v1_answer],
        ["host RAM pinned", gib(v0.host_ram_gib) if v0 and v0.needed else "—",
         gib(v1.recommended.host_ram_gib) if v1 else "—"],
        ["in words", v0.words() if v0 else m.v0_note, v1.words() if v1 else m.v1_note],
    ]
    body = (text("The same trace on both engines: what a V0 deployment sets today and what the "
                 "same deployment sets after moving to vLLM V1 (the release named in the table). The other "
                 "engine is a twin: the same model, GPU, TP, KV pool and explicitly set knobs; "
                 "everything left unset takes that engine's defaults, as after an upgrade (the "
                 "block size too: 16 tokens on V0, 64 on 0.34).")
            + table(rows, ["", "V0 --swap-space today", "V1 --kv-offloading-size after migrating"])
            + (text(f"Prefix hits: {m.block_words}.") if m.block_words else ""))
    return Section(title="Host tier: V0 → V1 migration", anchor="migration", body=body)
