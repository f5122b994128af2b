"""The requests the engine never runs, said once wherever the plan is (its headline, its details,
its JSON).

vLLM refuses a request it can never serve: a prompt that leaves no room for one output token in
`max_model_len` (V1: prompt >= max_model_len; V0: prompt > max_model_len; the API answers HTTP
400), or one that needs more KV blocks than the whole GPU pool holds (V1), or that no longer fits
the pool after a preemption (V0: FINISHED_IGNORED, reference D5). Their TTFT and TBT are in no
percentile, so a plan that meets its SLOs while one request in twenty is refused must say so:
the SLOs speak for the others only. No capacity knob brings them back (replicas serve the same
`max_model_len`); the context length does, up to the model's own, or the client truncates.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from replay.config import ResolvedEngine


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejections:
    num_rejected: int
    num_requests: int
    # Of the rejected: the prompts too long for max_model_len (the rest: too large for the pool).
    num_over_max_model_len: int
    max_model_len: int
    model_max_len: int                 # the model's max_position_embeddings
    longest_prompt_tokens: int         # of the rejected requests
    scheduler: str

    @property
    def share(self) -> float:
        return self.num_rejected / self.num_requests if self.num_requests else 0.0

    def short(self) -> str:
        """The headline's clause."""
        return (f"vLLM rejects {self.num_rejected:,} of {self.num_requests:,} requests "
                f"({self.share:.1%}: {self._why()}); no percentile counts them")

    def _why(self) -> str:
        rule = "≥" if self.scheduler == "v1" else ">"
        parts = []
        if self.num_over_max_model_len:
            parts.append(f"prompt {rule} --max-model-len {self.max_model_len:,}")
        if self.num_rejected > self.num_over_max_model_len:
            parts.append("more KV than the whole GPU pool holds")
        return "; ".join(parts)

    def words(self) -> str:
        """The details' line: what, why, and the knob (none of the capacity knobs)."""
        over, pool = self.num_over_max_model_len, self.num_rejected - self.num_over_max_model_len
        said = [f"vLLM rejects {self.num_rejected:,} of {self.num_requests:,} requests "
                f"({self.share:.1%}); TTFT, TBT and the SLOs count the others only"]
        if over:
            raise_it = self.max_model_len < self.model_max_len
            knob = (f"--max-model-len up to the model's {self.model_max_len:,} (replay with "
                    "it: the engine's defaults follow it)" if raise_it else
                    f"that is the model's own context ({self.model_max_len:,}): a longer-context "
                    "model, or truncation in the client")
            said.append(f"{over:,} prompts are too long for --max-model-len "
                        f"{self.max_model_len:,} (the longest: {self.longest_prompt_tokens:,} "
                        f"tokens); the knob: {knob}; more replicas do not help")
        if pool:
            said.append(f"{pool:,} need more KV blocks than the whole GPU pool holds; the knob: "
                        "a larger KV pool (fp8 KV cache, TP, a larger --num-gpu-blocks-override)")
        return "; ".join(said)

    def as_dict(self) -> dict:
        return {"requests": self.num_rejected, "of": self.num_requests, "share": self.share,
                "over_max_model_len": self.num_over_max_model_len,
                "max_model_len": self.max_model_len, "model_max_len": self.model_max_len,
                "longest_prompt_tokens": self.longest_prompt_tokens}


def too_long(prompt_tokens, max_model_len: int):
    """Prompts (an expression or a Series) V1 refuses with `max_model_len`; V0's rule is one
    token laxer, and the floors exclude these under both."""
    return prompt_tokens >= max_model_len


def rejections(requests: pl.DataFrame, engine: ResolvedEngine) -> Rejections | None:
    """The rejected requests of a replay's `requests` table; None when there are none."""
    rej = requests.filter(pl.col("status") == "rejected")
    if rej.height == 0:
        return None
    mml = engine.spec.max_model_len
    over = too_long(rej["prompt_tokens"], mml) if engine.config.scheduler == "v1" \
        else rej["prompt_tokens"] > mml
    return Rejections(num_rejected=rej.height, num_requests=requests.height,
                      num_over_max_model_len=int(over.sum()), max_model_len=mml,
                      model_max_len=engine.model.max_position_embeddings,
                      longest_prompt_tokens=int(rej["prompt_tokens"].max()),
                      scheduler=engine.config.scheduler)
