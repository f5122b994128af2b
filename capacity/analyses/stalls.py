"""TBT stall attribution: which TBT spikes are preemption stalls and which are not.

A preemption stall is the TBT sample of a request that spans its preemption (the `stalls` table):
from its last token before the preemption to its first token after, with the mode and the time
from the preemption to that token (recovery). TBT spikes without a preemption come from long
engine steps (large prefill chunks batched with decodes, or host KV traffic: swap, CPU offloading): every decode token of
such a step waits for it. They are listed from the `steps` table separately, so a reader can
look elsewhere (chunk size, `--max-num-batched-tokens`) instead of at KV capacity.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from capacity.analyses.metrics import nearest_rank


@dataclass(frozen=True, slots=True, kw_only=True)
class StallAttribution:
    threshold_s: float
    stalls: pl.DataFrame            # one row per preemption stall
    slow_steps: pl.DataFrame        # steps longer than the threshold with decodes in them
    preemption_spikes: int          # stalls above the threshold
    other_spikes: int               # decode tokens delayed by slow steps (not preemption)
    summary: str

    def as_dict(self) -> dict:
        return {"threshold_s": self.threshold_s, "preemption_spikes": self.preemption_spikes,
                "other_spikes": self.other_spikes, "summary": self.summary,
                "stalls_by_mode": self.stalls.group_by("mode").agg(
                    n=pl.len(), stall_p50_s=pl.col("stall_s").median(),
                    stall_max_s=pl.col("stall_s").max()).sort("mode").to_dicts()}


def attribute_stalls(tables: dict[str, pl.DataFrame], *, threshold_s: float | None = None,
                     ) -> StallAttribution:
    tbt = tables["tbt"]
    if threshold_s is None:
        p50 = nearest_rank(tbt["tbt_s"].to_numpy(), 0.5, tbt["weight"].to_numpy()) or 0.0
        threshold_s = 5 * p50
    req = tables["requests"].select("request_id", "priority", "prompt_tokens", "output_tokens")
    stalls = (tables["stalls"].join(req, on="request_id", how="left")
              .with_columns(recovery_s=pl.col("resumed_s") - pl.col("preempted_s"),
                            spike=pl.col("stall_s") > threshold_s)
              .sort("preempted_s"))
    steps = tables["steps"]
    # Host KV traffic: V0's swap-outs/ins, V1's CPU offloading stores/loads.
    moved = [c for c in ("swap_out_blocks", "swap_in_blocks", "offload_store_blocks",
                         "offload_load_blocks") if c in steps.columns]
    # The columns read, not the table (a report's own replays may be spilled to files).
    steps = steps.select("step", "start_s", "duration_s", "num_prefill_tokens",
                         "num_decode_tokens", *moved, "num_preempted")
    slow = (steps.filter((pl.col("duration_s") > threshold_s) & (pl.col("num_decode_tokens") > 0))
            .with_columns(cause=pl.when(pl.sum_horizontal(moved) > 0)
                          .then(pl.lit("host KV traffic in the step (swap / CPU offloading)"))
                          .when(pl.col("num_prefill_tokens") > 0)
                          .then(pl.lit("prefill batched with decodes"))
                          .otherwise(pl.lit("large decode batch / long contexts"))))
    pre_spikes = int(stalls["spike"].sum() or 0)
    other = int(slow["num_decode_tokens"].sum() or 0)
    text = (f"{pre_spikes} TBT spikes above {threshold_s * 1000:.0f} ms are preemption stalls "
            f"({stalls.height} stalls in all); {other} decode tokens waited on {slow.height} slow "
            f"steps without a preemption of their own — look at chunked prefill / "
            f"--max-num-batched-tokens for those, not at KV capacity")
    return StallAttribution(threshold_s=threshold_s, stalls=stalls, slow_steps=slow,
                            preemption_spikes=pre_spikes, other_spikes=other, summary=text)


@dataclass(frozen=True, slots=True, kw_only=True)
class StallBatches:
    """One request's batches around each of its preemption stalls (`batches` table: a replay
    with `--record-batches`): the steps before and at each preemption, and at and after the
    resume, every request in those batches with what it got."""
    request_id: int
    rows: pl.DataFrame          # stall, phase, step, start_s, seq, request_id, tokens, kind, this
    per_step: pl.DataFrame      # one row per step: batch size, tokens, this request, victims
    summary: str


def drill_steps(tables: dict[str, pl.DataFrame], *, steps_around: int = 1,
                max_stalls: int = 3) -> tuple[int, int] | None:
    """The steps (first, last; 1-based) `stall_batches` shows for the worst-stalled request of
    a replay without batches: replaying with `record_batches=drill_steps(...)` records only
    those (a day of traffic's every batch is one row per request per step). None: no stall."""
    stalls = tables["stalls"]
    if stalls.height == 0:
        return None
    rid = int(stalls.sort("stall_s", descending=True, maintain_order=True)["request_id"][0])
    ev = tables["events"]
    pre = (ev.filter((pl.col("request_id") == rid) & pl.col("kind").str.starts_with("preempt_"))
           .sort("step", "seq").head(max_stalls))
    if pre.height == 0:
        return None
    first = max(1, int(pre["step"].min()) - steps_around)
    last_t = float(stalls.filter(pl.col("request_id") == rid)["resumed_s"].max())
    start = tables["steps"]["start_s"].to_numpy()
    last = int(np.searchsorted(start, last_t, side="right")) + steps_around + 1
    return first, max(first, last)


def stall_batches(tables: dict[str, pl.DataFrame], request_id: int | None = None, *,
                  steps_around: int = 1, max_stalls: int = 3) -> StallBatches | None:
    """The batches around the stalls of `request_id` (default: the request of the longest
    stall); None when the run has no stall. Raises if the run recorded no batches."""
    b = tables.get("batches")
    if b is None or b.height == 0:
        raise ValueError("this run has no batches table: replay it with --record-batches "
                         "(replay(..., record_batches=True))")
    stalls = tables["stalls"]
    if stalls.height == 0:
        return None
    if request_id is None:
        request_id = int(stalls.sort("stall_s", descending=True, maintain_order=True)
                         ["request_id"][0])
    ev = tables["events"]
    pre = (ev.filter((pl.col("request_id") == request_id)
                     & pl.col("kind").str.starts_with("preempt_"))
           .sort("step", "seq").head(max_stalls))
    if pre.height == 0:
        raise ValueError(f"request {request_id} was never preempted in this run")
    mine = b.filter(pl.col("request_id") == request_id).select("step", "kind")
    windows = []
    for i, (p_step,) in enumerate(pre.select("step").iter_rows(), start=1):
        resumed = mine.filter(pl.col("step") > p_step)["step"]
        r_step = int(resumed.min()) if resumed.len() else None
        spans = [(s, "before" if s < p_step else "preempted")
                 for s in range(p_step - steps_around, p_step + 1)]
        if r_step is not None:
            spans += [(s, "resumed" if s == r_step else "after")
                      for s in range(r_step, r_step + steps_around + 1)]
        windows.append(pl.DataFrame({"stall": [i] * len(spans), "step": [s for s, _ in spans],
                                     "phase": [ph for _, ph in spans]},
                                    schema={"stall": pl.Int32, "step": pl.Int64,
                                            "phase": pl.Utf8}))
    win = pl.concat(windows)
    starts = tables["steps"].select("step", "start_s")
    rows = (win.join(b.drop("run_id"), on="step", how="inner")
            .join(starts, on="step", how="left")
            .with_columns(this=pl.col("request_id") == request_id,
                          kind=pl.col("kind").cast(pl.Utf8))
            .select("stall", "phase", "step", "start_s", "seq", "request_id", "num_new_tokens",
                    "num_computed_tokens", "kind", "this")
            .sort("stall", "step", "seq"))
    victims = (ev.filter(pl.col("kind").str.starts_with("preempt_")).sort("step", "seq")
               .group_by("step", maintain_order=True).agg(preempted=pl.col("request_id")))
    per_step = (rows.group_by("stall", "phase", "step", "start_s", maintain_order=True)
                .agg(batch_size=pl.len(), tokens=pl.col("num_new_tokens").sum(),
                     this_tokens=pl.col("num_new_tokens").filter(pl.col("this")).first(),
                     this_kind=pl.col("kind").filter(pl.col("this")).first())
                .join(victims, on="step", how="left").sort("stall", "step"))
    stall_s = stalls.filter(pl.col("request_id") == request_id)["stall_s"]
    summary = (f"request {request_id}: {pre.height} preemption(s) shown, longest stall "
               f"{float(stall_s.max()) * 1000:.0f} ms; each stall's batches from "
               f"{steps_around} step(s) before its preemption to {steps_around} after its resume "
               f"(preempted = the victims in the order the scheduler chose them)")
    return StallBatches(request_id=request_id, rows=rows, per_step=per_step, summary=summary)
