"""TBT stall attribution: which TBT spikes are preemption stalls and which are not.

A preemption stall is the TBT sample of a request that spans its preemption (the `stalls` table):
from its last token before the preemption to its first token after, with the mode and the time
from the preemption to that token (recovery). TBT spikes without a preemption come from long
engine steps (large prefill chunks batched with decodes, or swap traffic): every decode token of
such a step waits for it. They are listed from the `steps` table separately, so a reader can
look elsewhere (chunk size, `--max-num-batched-tokens`) instead of at KV capacity.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    slow = (tables["steps"].filter((pl.col("duration_s") > threshold_s)
                                   & (pl.col("num_decode_tokens") > 0))
            .select("step", "start_s", "duration_s", "num_prefill_tokens", "num_decode_tokens",
                    "swap_out_blocks", "swap_in_blocks", "num_preempted")
            .with_columns(cause=pl.when(pl.col("swap_out_blocks") + pl.col("swap_in_blocks") > 0)
                          .then(pl.lit("swap traffic in the step"))
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
