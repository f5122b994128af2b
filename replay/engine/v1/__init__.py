"""kvcap's model of vLLM's V1 engine core scheduling (0.33.0 `vllm/v1/core`): block pool, KV cache
manager, queues and scheduler (the reference implementation; replay/engine/v1/_core.c is the
compiled one). Must not import traces/, capacity/ or torch.

`V1Scheduler` is imported on first use: a compiled replay loads `replay.engine.v1._core` only, not
the reference scheduler and its modules (~10 ms of every `kvcap replay`)."""

__all__ = ["V1Scheduler"]


def __getattr__(name: str):
    if name == "V1Scheduler":
        from replay.engine.v1.scheduler import V1Scheduler
        return V1Scheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
