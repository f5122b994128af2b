"""What binds a deployment, read off its load search (docs/planning.md, "The binding constraint").

The search's probes say which target fails first as the load grows, and the floor — the p99-length
prompt of the trace replayed alone, cold (no prefix hits): the TTFT p99 no load reduction gets
below — says what no amount of capacity fixes:
- `long_prompt_prefill`: TTFT p99 misses even at near-zero load — the longest prompts' own
  prefill takes longer than the SLO on one replica. Replicas do not help; tensor parallelism (a
  faster prefill) or an SLO per prompt-length class does.
- `decode_step`: TBT p99 misses even at near-zero load — one decode step of the trace's shortest
  prompt alone on the GPU (the *decode floor*: every TBT sample is at least one step) takes
  longer than the SLO. No batch limit and no replica count helps; a faster GPU, more tensor
  parallelism or a looser TBT SLO does. Checked only when TBT binds as a prefill chunk would.
- `prefill_chunk`: TBT p99 misses without preemption as the load grows — a step that carries a prefill chunk of up
  to `--max-num-batched-tokens` tokens is a long gap for every decoding request in it. The knob is
  a smaller `--max-num-batched-tokens`.
- `kv_blocks`: the preemption budget fails, or TBT misses because of preemption stalls — the KV
  pool runs dry. The knobs: `--max-num-seqs`, the host tier, a larger pool (fp8 KV, TP), replicas.
- `compute`: the queue grows or TTFT misses from queueing — throughput. The knob: replicas.
The order of that list is the precedence when one probe breaks several targets, except that an
engine that cannot keep up is compute-bound first.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from capacity.analyses.headroom import LoadPoint
from capacity.units import seconds

KNOBS = {"long_prompt_prefill": "--tensor-parallel-size (a faster prefill) or a TTFT SLO per "
                                "prompt-length class; more replicas do not help",
         "decode_step": "a faster GPU, --tensor-parallel-size (a faster decode step) or a looser "
                        "TBT SLO; batch limits and more replicas do not help",
         "prefill_chunk": "a smaller --max-num-batched-tokens (shorter prefill chunks per step)",
         "kv_blocks": "--max-num-seqs, the host tier, a larger KV pool (fp8 KV cache, TP) or "
                      "replicas",
         "compute": "replicas (or rate limiting)"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    # long_prompt_prefill | decode_step | prefill_chunk | kv_blocks | compute | None
    constraint: str | None
    evidence: str
    knob: str
    floor: LoadPoint | None     # the p99-length prompt replayed alone
    replicas_help: bool         # False: no number of replicas fixes it
    # The decode floor (the shortest prompt alone: its TBT p99), measured only where TBT binds
    # without preemption.
    decode_floor_s: float | None = None

    def as_dict(self) -> dict:
        return {"constraint": self.constraint, "evidence": self.evidence, "knob": self.knob,
                "replicas_help": self.replicas_help,
                "floor_ttft_s": self.floor.ttft_p99_s if self.floor else None,
                "floor_tbt_s": self.decode_floor_s}


def _ttft_fails(p: LoadPoint, slo: float) -> bool:
    return p.ttft_p99_s is None or p.ttft_p99_s > slo


def _tbt_fails(p: LoadPoint, slo: float) -> bool:
    return p.tbt_p99_s is None or p.tbt_p99_s > slo


def cause(p: LoadPoint, *, slo_ttft_p99_s: float, slo_tbt_p99_s: float) -> str | None:
    """What a failing probe breaks first (module docstring); None when it passes."""
    if p.ok:
        return None
    if not p.sustainable:
        return "compute"
    if not p.within_budget:
        return "kv_blocks"
    if _tbt_fails(p, slo_tbt_p99_s) and not _ttft_fails(p, slo_ttft_p99_s):
        return "kv_blocks" if p.preemptions else "prefill_chunk"
    if _ttft_fails(p, slo_ttft_p99_s):
        return "compute"
    return "kv_blocks" if p.preemptions else "compute"


def decode_bound(b: Binding, decode: LoadPoint, *, prompt_tokens: int,
                 slo_tbt_p99_s: float) -> Binding:
    """A `prefill_chunk` binding checked against the decode floor (`decode`: the trace's shortest
    prompt alone): above the SLO, `decode_step`; within 80% of it, said (replicas buy little)."""
    tbt = decode.tbt_p99_s
    alone = f"one decode step of the shortest prompt ({prompt_tokens:,} tokens) alone"
    if tbt is None:
        return b
    if tbt > slo_tbt_p99_s:
        return Binding(constraint="decode_step", knob=KNOBS["decode_step"], floor=b.floor,
                       replicas_help=False, decode_floor_s=tbt, evidence=(
                           f"{alone} takes {_ms(tbt)} > the {_ms(slo_tbt_p99_s)} TBT SLO: every "
                           f"token gap is at least one step, so no load, batch limit or replica "
                           f"count meets it"))
    near = (f"; {alone} already takes {_ms(tbt)} ({tbt / slo_tbt_p99_s:.0%} of the TBT SLO): "
            f"a step may carry little besides decodes, and replicas buy that room dearly"
            if tbt > 0.8 * slo_tbt_p99_s else "")
    return dataclasses.replace(b, evidence=b.evidence + near, decode_floor_s=tbt)


def _ms(v: float | None) -> str:
    return seconds(v, missing="—")


def diagnose(points: tuple[LoadPoint, ...], floor: LoadPoint, *, floor_prompt_tokens: int,
             scale: float | None, failed_at: float | None, slo_ttft_p99_s: float,
             slo_tbt_p99_s: float) -> Binding:
    """`points`: the capacity search's probes (rate scale, no surge); `floor`: the p99-length
    prompt alone; `scale`/`failed_at`: the search's answer."""
    kw = dict(slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s)
    alone = f"the p99-length prompt ({floor_prompt_tokens:,} tokens) alone"
    # A floor with no TTFT never ran (rejected: too large for the pool); that is no prefill time,
    # and the plan states its rejections on their own (capacity/analyses/rejections.py).
    if floor.ttft_p99_s is not None and floor.ttft_p99_s > slo_ttft_p99_s:
        return Binding(constraint="long_prompt_prefill", knob=KNOBS["long_prompt_prefill"],
                       floor=floor, replicas_help=False, evidence=(
                           f"{alone} has TTFT {_ms(floor.ttft_p99_s)} > the "
                           f"{_ms(slo_ttft_p99_s)} SLO: the longest prompts' own prefill misses "
                           f"it on one replica at any load"))
    fail = next((p for p in points if not p.surge and p.rate_scale == failed_at), None)
    if fail is None:
        return Binding(constraint=None, knob="", floor=floor, replicas_help=True,
                       evidence=f"nothing fails up to ×{scale:g} of the load (the largest searched)"
                       if scale else "no failing probe")
    c = cause(fail, **kw)
    near = (f"; {alone} already takes {_ms(floor.ttft_p99_s)} to its first token "
            f"({floor.ttft_p99_s / slo_ttft_p99_s:.0%} of the SLO): the long prompts' own "
            f"prefill leaves little room that replicas can buy"
            if floor.ttft_p99_s is not None and floor.ttft_p99_s > 0.8 * slo_ttft_p99_s else "")
    return Binding(constraint=c, knob=KNOBS[c], floor=floor, replicas_help=True, evidence=(
        f"at ×{fail.rate_scale:g} of the load: {fail.breaks}" + near))
