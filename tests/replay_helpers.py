"""Small engines for loop-level tests: a tiny model shape and a scheduler spec with tiny pools."""
from __future__ import annotations

import numpy as np

from replay.engine.prefix import TraceBlockKeys, UniqueBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState
from replay.run import run_engine
from replay.timing.cost_model import CostConstants, CostModel, ModelShape

TINY_SHAPE = ModelShape(num_layers=4, hidden_size=256, num_attention_heads=4, head_dim=64,
                        vocab_size=1000, num_layer_params=4_000_000, weight_bytes=8_000_000)
TINY_CONST = CostConstants(flops_per_s=1e12, hbm_bytes_per_s=1e10, host_link_bytes_per_s=1e9,
                           interconnect_bytes_per_s=1e10, overhead_s=0.002)


def tiny_cost_model(kv_bytes_per_token: int = 4096, block_size: int = 4, *,
                    async_scheduling: bool = False) -> CostModel:
    return CostModel(shape=TINY_SHAPE, constants=TINY_CONST, tp=1,
                     kv_bytes_per_token=kv_bytes_per_token,
                     kv_bytes_per_block=kv_bytes_per_token * block_size,
                     async_scheduling=async_scheduling)


def tiny_spec(**kw) -> SchedulerSpec:
    base = dict(block_size=4, num_gpu_blocks=32, num_cpu_blocks=16, max_num_seqs=8,
                max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=True,
                enable_prefix_caching=True, kv_bytes_per_block=4096 * 4)
    base.update(kw)
    return SchedulerSpec(**base)


def run_tiny(engine: str, spec: SchedulerSpec, arrival_s, prompt, output, *, priority=None,
             prefix_hashes=None, implementation: str = "auto"):
    state = RequestState(arrival_s=np.asarray(arrival_s, float), prompt_len=prompt,
                         output_len=output, priority=priority)
    if prefix_hashes is None:
        keys = UniqueBlockKeys()
    else:
        keys = TraceBlockKeys(block_size=spec.block_size, prompt_len=prompt,
                              prefix_hashes=prefix_hashes, hash_block_tokens=8)
    return run_engine(engine, spec, state, keys, tiny_cost_model(block_size=spec.block_size),
                      kv_bytes_per_block=spec.kv_bytes_per_block, implementation=implementation)
