"""The shapes of real vLLM server output around the records logparse reads: glued records, line
prefixes (k8s/journald ISO time, docker compose `name  | `, Ray/vLLM `(Proc pid=N)`), engine
configuration lines (-> `log_engine`) and engine error/abort lines (-> `log_events`).

Found in what users pasted publicly (tests/data/logs/public, one file per thread): a terminal that
lost its newlines glues records ("...CPU KV cache usage: 0.0% (_AsyncLLMEngine pid=1974) INFO 01-25
...", "...hit rate: 0.0%INFO 07-28 ..."), tqdm bars end right before the next record, and the lines
that state the engine's size ("# GPU blocks: 1478, # CPU blocks: 2048", "GPU KV cache size: 42,656
tokens", "Maximum concurrency for 32,768 tokens per request: 1.30x") or its death ("RuntimeError:
Aborted due to the lack of CPU swap space") are often pasted without any logger prefix.
Pure functions over text; must not import duckdb, altair or replay.
"""
from __future__ import annotations

import re

import polars as pl

# Where a logger record starts: vLLM's "LEVEL MM-DD HH:MM:SS", anywhere in a line (a lost newline
# glues it to whatever came before, a digit or a letter included: "...preemption=51INFO 01-25 ...",
# "...out of memoryINFO 01-25 ..."); a process tag "(Proc pid=N) " right before it belongs to it
# (`_tag_start`, a bounded look back: a regex that tries the tag at every position of a long run of
# word characters costs quadratic time).
RECORD_START = re.compile(r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}")
_TAG_MAX = 100          # characters of a process name / pid / spaces looked back over
_PREFIXES = (
    re.compile(r"^\W{0,2}\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s*(?:\|\s*)?"),
    re.compile(r"^[\w.-]+\s+\|\s"),                         # docker compose: "vllm-1  | "
    re.compile(r"^\(?[\w.-]+ pid=\d+\)\s*"),                # Ray / vLLM >= 0.10 process tag
    re.compile(r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+"
               r"\[?[\w./-]+:\d+\]\s*"),
)
_ENGINE_TAG = re.compile(r"^Engine \d+:\s*")
_INT = r"(\d{1,3}(?:,\d{3})+|\d+)"    # "2,042,016" or "1478" (then ", # CPU blocks")
_NUM = r"(\d+(?:\.\d+)?)"
# Engine-configuration statements, matched at the start of a message (so prose that quotes one is
# not an engine line). Each names the `log_engine` columns its groups fill.
ENGINE_LINES = (
    (re.compile(rf"#?\s*GPU blocks:\s*{_INT}(?:,\s*#?\s*CPU blocks:\s*{_INT})?"),
     ("num_gpu_blocks", "num_cpu_blocks")),
    (re.compile(rf"vllm cache_config_info with initialization after num_gpu_blocks is:\s*{_INT}"),
     ("num_gpu_blocks",)),
    (re.compile(rf"GPU KV cache size:\s*{_INT} tokens"), ("kv_cache_tokens",)),
    (re.compile(rf"Maximum concurrency for {_INT} tokens per request:\s*{_NUM}x"),
     ("max_concurrency_tokens", "max_concurrency")),
    (re.compile(rf"Available KV cache memory:\s*{_NUM}\s*GiB"), ("kv_cache_gib",)),
    (re.compile(rf"Memory profiling results:.*?\bkv_cache_size={_NUM}\s*GiB"), ("kv_cache_gib",)),
    (re.compile(rf"Memory profiling takes.*?reserved for KV Cache is {_NUM}\s*GiB"), ("kv_cache_gib",)),
)
# Engine errors, searched anywhere in a record; the first that matches names its kind.
EVENTS = (
    ("swap_abort", re.compile(r"Aborted due to the lack of CPU swap space")),
    ("kv_cache_too_small", re.compile(r"larger than the maximum number of tokens that can be stored in KV cache")),
    ("no_kv_cache_memory", re.compile(r"No available memory for the cache blocks")),
    ("cuda_oom", re.compile(r"CUDA out of memory|\bOutOfMemoryError\b")),
    ("engine_dead", re.compile(r"EngineDeadError|Engine core proc \S+ died unexpectedly")),
    ("error", re.compile(r"\b(?:ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}")),
)
ENGINE_SCHEMA = {
    "source_file": pl.Utf8, "line": pl.Int64, "time": pl.Datetime("us"), "epoch_s": pl.Float64,
    "pid": pl.Int64, "num_gpu_blocks": pl.Int64, "num_cpu_blocks": pl.Int64, "kv_cache_tokens": pl.Int64,
    "kv_cache_gib": pl.Float64, "max_concurrency": pl.Float64, "max_concurrency_tokens": pl.Int64,
    "text": pl.Utf8,
}
EVENT_SCHEMA = {
    "source_file": pl.Utf8, "line": pl.Int64, "time": pl.Datetime("us"), "epoch_s": pl.Float64,
    "pid": pl.Int64, "kind": pl.Utf8, "text": pl.Utf8,
}
_FLOAT_COLS = {"kv_cache_gib", "max_concurrency"}
# Cheap substrings: a record without any of them is no engine line (most lines of a log).
ENGINE_MARKS = ("GPU blocks", "num_gpu_blocks", "KV cache size", "Maximum concurrency",
                "KV cache memory", "kv_cache_size=", "reserved for KV Cache")


def split_records(line: str) -> list[str]:
    """A physical line -> the logger records glued into it (usually one: the line itself). Linear
    in the line's length."""
    starts = [_tag_start(line, m.start()) for m in RECORD_START.finditer(line)]
    if not starts:
        return [line]
    if starts[0] <= _line_prefix_end(line):
        starts = starts[1:]         # the line's own record, after its ISO time / docker name
    if not starts:
        return [line]
    cuts = [0, *starts, len(line)]
    return [line[a:b].rstrip() for a, b in zip(cuts, cuts[1:]) if b > a]


def _line_prefix_end(line: str) -> int:
    """Where a line's own record starts: after the prefixes a collector adds (ISO time, docker
    compose name, process tag)."""
    pos = 0
    for rx in _PREFIXES[:3]:
        m = rx.match(line[pos:pos + 200])
        if m:
            pos += m.end()
    return pos


def _tag_start(line: str, s: int) -> int:
    """Where the record whose level word starts at `s` begins: at its "(Name pid=N) " tag when one
    ends right before `s`, else at `s`."""
    j = s
    while j > 0 and s - j < _TAG_MAX and line[j - 1].isspace():
        j -= 1
    if j == 0 or line[j - 1] != ")":
        return s
    k = line.rfind(" pid=", max(0, j - _TAG_MAX), j)
    if k < 0 or not line[k + 5:j - 1].isdigit():
        return s
    i = k
    while i > 0 and k - i < _TAG_MAX and (line[i - 1].isalnum() or line[i - 1] in "._-"):
        i -= 1
    if i == k:
        return s
    return i - 1 if i > 0 and line[i - 1] == "(" else i


def message(record: str) -> str:
    """The record without its prefixes (ISO time, docker name, process tag, vLLM logger prefix)."""
    text = record
    for rx in _PREFIXES:
        m = rx.match(text)
        if m:
            text = text[m.end():]
    return _ENGINE_TAG.sub("", text.lstrip())


class FactError(ValueError):
    """An engine-configuration line whose value kvcap cannot store (the reason, one line)."""


_MAX_COUNT = 2**53      # blocks, tokens: far above any real engine; the columns are 64-bit
# "# GPU blocks: N" glued right after other text (a traceback line that lost its newline:
# "...out of memory# GPU blocks: 1478"); after a blank or a bracket it is prose quoting one.
_GLUED_BLOCKS = re.compile(rf"(?<=[^\s(\[\"'])#\s*GPU blocks:\s*{_INT}(?:,\s*#?\s*CPU blocks:\s*{_INT})?")


def engine_fields(record: str) -> dict | None:
    """The `log_engine` fields a record states, or None when it is no engine-configuration line;
    FactError for a value out of range."""
    if not any(mark in record for mark in ENGINE_MARKS):
        return None
    msg = message(record)
    for rx, cols in ENGINE_LINES:
        m = rx.match(msg)
        if m:
            return _values(cols, m)
    m = _GLUED_BLOCKS.search(msg)
    return _values(ENGINE_LINES[0][1], m) if m else None


def _values(cols: tuple, m: re.Match) -> dict:
    out = {}
    for col, v in zip(cols, m.groups()):
        if v is None:
            continue
        if len(v) > 24:
            raise FactError(f"{col}: {v[:24]}... is out of range")
        out[col] = float(v) if col in _FLOAT_COLS else int(v.replace(",", ""))
        if not 0 <= out[col] <= _MAX_COUNT:
            raise FactError(f"{col}: {v} is out of range (0 to {_MAX_COUNT:,})")
    return out


def event_kind(record: str) -> str | None:
    for kind, rx in EVENTS:
        if rx.search(record):
            return kind
    return None


def looks_like_server_output(text: str) -> bool:
    """Whether text holds a line this module reads (an engine line or an engine error)."""
    return any(_is_engine_line(r) or event_kind(r) in ("swap_abort", "kv_cache_too_small",
                                                       "no_kv_cache_memory", "engine_dead")
               for line in text.splitlines() for r in split_records(line))


def _is_engine_line(record: str) -> bool:
    try:
        return engine_fields(record) is not None
    except FactError:
        return True
