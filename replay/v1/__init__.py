"""kvcap's model of vLLM's V1 engine core scheduling (0.33.0 `vllm/v1/core`): block pool, KV cache
manager, queues, scheduler and the steady-decode fast path. Must not import traces/, capacity/ or
torch."""
from replay.v1.scheduler import V1Scheduler

__all__ = ["V1Scheduler"]
