"""vLLM V0 (0.10.1.1 `vllm/core/`) scheduler and block manager, reproducing real vLLM's per-step
decisions (reference A, G; oracle S1-S12). Must not import traces/, capacity/ or torch.
"""
from replay.v0.block_manager import AllocStatus, BlockManagerV0
from replay.v0.logline import preemption_warning
from replay.v0.scheduler import V0Scheduler

__all__ = ["AllocStatus", "BlockManagerV0", "V0Scheduler", "preemption_warning"]
