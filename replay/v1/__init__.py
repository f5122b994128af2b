"""kvcap's model of vLLM's V1 engine core scheduling (0.33.0 `vllm/v1/core`): block pool, KV cache
manager, queues and scheduler (the reference implementation; replay/v1/_core.c is the compiled one).
Must not import traces/, capacity/ or torch."""
from replay.v1.scheduler import V1Scheduler

__all__ = ["V1Scheduler"]
