"""The tiny torch stub the stub tests build by hand: one torch thread, 4-token blocks, a
2-layer model with one KV head of 8, its paged KV on the CPU, and the shared Azure conv trace."""
from __future__ import annotations

from pathlib import Path

import torch

from replay.stub.kv import KVLayout, PagedKV
from replay.stub.model import StubShape

torch.set_num_threads(1)
CPU = torch.device("cpu")
B = 4
TINY = StubShape(kind="tiny", num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1,
                 head_dim=8, intermediate_size=64, vocab_size=50)
AZURE_CONV = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def tiny_kv(num_gpu_blocks: int = 16, num_cpu_blocks: int = 8,
            dtype: torch.dtype = torch.bfloat16) -> PagedKV:
    return PagedKV(KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, block_size=B,
                            num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                            dtype=dtype), CPU)
