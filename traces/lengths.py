"""Prompt / output length distributions for synthetic traces.

Owns the parametric fits (lognormal, written down as constants so the default scenario needs no data
files) and the empirical samplers over the shared real traces (`azure-conv`, `azure-code`,
`mooncake`, read from ../shared/traces beside the repository, or $KVCAP_SHARED_TRACES).

`LOGNORMAL_CONV` is fitted to AzureLLMInferenceTrace_conv.csv by matching the median and the mean:
mu = ln(median), sigma = sqrt(2 ln(mean / median)). Prompt: median 1020, mean 1154.7 ->
mu 6.9276, sigma 0.4982. Output: median 129, mean 211.1 -> mu 4.8598, sigma 0.9925. Samples are
rounded and clipped to the trace's ranges (prompt <= 14,050; output <= 1,000, the conv cap), which
brings the output mean to ~201. Its prompt tail is lighter than the real one (p99 ~3.3k vs 4.1k).
Empirical samplers draw whole rows, so the prompt/output pairing of the real trace is kept.
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from traces.schema import TraceError


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNormalLengths:
    prompt_mu: float
    prompt_sigma: float
    output_mu: float
    output_sigma: float
    prompt_max: int
    output_max: int

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        prompt = np.rint(rng.lognormal(self.prompt_mu, self.prompt_sigma, n))
        output = np.rint(rng.lognormal(self.output_mu, self.output_sigma, n))
        return (np.clip(prompt, 1, self.prompt_max).astype(np.int32),
                np.clip(output, 1, self.output_max).astype(np.int32))


LOGNORMAL_CONV = LogNormalLengths(prompt_mu=math.log(1020), prompt_sigma=0.4982,
                                  output_mu=math.log(129), output_sigma=0.9925,
                                  prompt_max=14_050, output_max=1_000)
# Offline batch jobs (summarisation / extraction): longer prompts and outputs than chat.
LOGNORMAL_BATCH = LogNormalLengths(prompt_mu=math.log(3000), prompt_sigma=0.6,
                                   output_mu=math.log(500), output_sigma=0.5,
                                   prompt_max=16_000, output_max=2_000)

PARAMETRIC: dict[str, LogNormalLengths] = {"lognormal": LOGNORMAL_CONV, "lognormal-batch": LOGNORMAL_BATCH}
EMPIRICAL_FILES: dict[str, str] = {"azure-conv": "AzureLLMInferenceTrace_conv.csv",
                                   "azure-code": "AzureLLMInferenceTrace_code.csv",
                                   "mooncake": "conversation_trace.jsonl"}
LENGTH_NAMES = (*PARAMETRIC, *EMPIRICAL_FILES)


def shared_traces_dir() -> Path:
    env = os.environ.get("KVCAP_SHARED_TRACES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "traces"


@lru_cache(maxsize=4)
def _empirical(name: str) -> tuple[np.ndarray, np.ndarray]:
    from traces.loaders import load_trace  # deferred: loaders are only needed for named traces

    path = shared_traces_dir() / EMPIRICAL_FILES[name]
    if not path.is_file():
        raise TraceError(f"lengths {name!r} need {path} (not found); use lengths='lognormal' instead")
    df = load_trace(path)
    return df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy()


def sample_lengths(lengths: str | LogNormalLengths, n: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, output) pairs as int32 arrays."""
    if isinstance(lengths, LogNormalLengths):
        return lengths.sample(n, rng)
    if lengths in PARAMETRIC:
        return PARAMETRIC[lengths].sample(n, rng)
    if lengths in EMPIRICAL_FILES:
        prompt, output = _empirical(lengths)
        idx = rng.integers(0, len(prompt), n)
        return prompt[idx].astype(np.int32), output[idx].astype(np.int32)
    raise TraceError(f"unknown lengths {lengths!r}; use one of {', '.join(LENGTH_NAMES)}")
