"""vLLM V0 (0.10.1.1 `vllm/core/`) scheduler and block manager, reproducing real vLLM's per-step
decisions (reference A, G; oracle S1-S12). Must not import traces/, capacity/ or torch.

The reference classes are imported on first use: a compiled replay loads `replay.engine.v0._core`
only (~7 ms of every `kvcap replay`).
"""

__all__ = ["AllocStatus", "BlockManagerV0", "V0Scheduler", "preemption_warning"]

_WHERE = {"AllocStatus": "replay.engine.v0.block_manager",
          "BlockManagerV0": "replay.engine.v0.block_manager",
          "V0Scheduler": "replay.engine.v0.scheduler",
          "preemption_warning": "replay.engine.v0.logline"}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
