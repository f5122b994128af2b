"""Engine facts a production log states (`log_engine`), as replay settings (`kvcap replay --from-logs`).

The GPU block count of the server that served the traffic is the one number a replay most needs
and most often gets wrong (the memory formula depends on the vLLM version, the GPU and the
activation peak). A log states it as "# GPU blocks: N" (V0, V1 before 0.8), "num_gpu_blocks is: N"
(V1 cache_config_info) or only "GPU KV cache size: T tokens" (V1 >= 0.8: N = T / block_size for
one KV-cache group). The latest such line of the chosen log wins (the last start-up).
Must not import altair.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from capacity.evidence.logs import read_evidence


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFacts:
    num_gpu_blocks: int
    num_cpu_blocks: int | None
    source_file: str
    line: int
    derived: str | None        # how num_gpu_blocks was derived when not stated (e.g. from tokens)

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


def engine_facts(db: Path, *, block_size: int, source: str | None = None) -> EngineFacts:
    eng = read_evidence(db, "log_engine")["log_engine"]
    if source is not None:
        eng = eng.filter(pl.col("source_file") == source)
    known = eng.filter(pl.col("num_gpu_blocks").is_not_null() | pl.col("kv_cache_tokens").is_not_null())
    if known.height == 0:
        where = f" of --log-source {source}" if source else ""
        raise ValueError(f"{db}: no engine line{where} states the GPU blocks or the KV cache size "
                         "(load the server's start-up log with `kvcap logs`)")
    sources = sorted(set(known["source_file"].to_list()))
    if len(sources) > 1:
        raise ValueError(f"{db}: several logs state engine sizes ({', '.join(sources)}); pick one with --log-source")
    last = known.sort(pl.col("epoch_s").fill_null(-1.0), "line").row(-1, named=True)
    cpu = known.filter(pl.col("num_cpu_blocks").is_not_null())
    cpu_blocks = int(cpu.sort(pl.col("epoch_s").fill_null(-1.0), "line")["num_cpu_blocks"][-1]) if cpu.height else None
    if last["num_gpu_blocks"] is not None:
        return EngineFacts(num_gpu_blocks=int(last["num_gpu_blocks"]), num_cpu_blocks=cpu_blocks,
                           source_file=last["source_file"], line=int(last["line"]), derived=None)
    blocks = int(last["kv_cache_tokens"]) // block_size
    return EngineFacts(num_gpu_blocks=blocks, num_cpu_blocks=cpu_blocks, source_file=last["source_file"],
                       line=int(last["line"]),
                       derived=f"GPU KV cache size {last['kv_cache_tokens']:,} tokens / block size {block_size}")
