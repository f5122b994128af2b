"""Trace layouts: which source column feeds which canonical field, how time is written, and detection.

Owns the known formats (Azure 2023, Mooncake, BurstGPT, Vidur/Splitwise, kvcap's own Parquet, and
the lengths-only layouts: Vidur's arxiv-summarization / BWB files and canonical length columns), the
generic mapping (`{"source column": "canonical field"}`, CLI `--map col=field`) and the detection
from header / first JSON keys. An unknown layout raises a `TraceError` that lists the columns found
and the flags that map them. Must not import replay/ or capacity/.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from traces.schema import COLUMNS, TraceError
from traces.sources import Source
from traces.timeparse import TIME_UNITS_S

REQUIRED_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
# A file with these and no arrival times is lengths-only (`--arrivals` gives it arrivals).
LENGTH_FIELDS = ("prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = ("request_id", "priority", "tenant", "prefix_hashes")


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatSpec:
    name: str
    # canonical field -> source column; fields listed in `optional` may be absent from the file.
    fields: Mapping[str, str]
    optional: frozenset[str] = frozenset()
    time_unit: str | None = None          # numeric times
    timestamp_format: str | None = None   # text times ("auto" = detect from the first value)
    # The format promises rows sorted by time: a decreasing timestamp is an error naming the line.
    # Otherwise rows are sorted by time (stable, so ties keep file order) and the count is reported.
    sorted_input: bool = False
    # Make times relative to the first request. kvcap's Parquet is already relative (exact round-trip).
    rebase: bool = True

    @property
    def lengths_only(self) -> bool:
        """No arrival times: the loader attaches synthetic ones (traces.arrivals) or refuses."""
        return "arrival_s" not in self.fields

    def present(self, src: Source) -> dict[str, str]:
        """The field -> column pairs this file has; a missing required column is an error."""
        out = {}
        for field, column in self.fields.items():
            if column in src.columns:
                out[field] = column
            elif field not in self.optional:
                raise TraceError(f"{src.path}, line 1, column '{column}': missing column for {field} "
                                 f"in {self.name} format; columns found: {', '.join(src.columns)}")
        return out


AZURE = FormatSpec(name="azure", fields={"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens",
                                         "output_tokens": "GeneratedTokens"},
                   timestamp_format="auto", sorted_input=True)
MOONCAKE = FormatSpec(name="mooncake", fields={"arrival_s": "timestamp", "prompt_tokens": "input_length",
                                               "output_tokens": "output_length", "prefix_hashes": "hash_ids"},
                      optional=frozenset({"prefix_hashes"}), time_unit="ms", sorted_input=True)
# Model and Log Type feed the tenant and the failure rule (see traces.loaders).
BURSTGPT = FormatSpec(name="burstgpt", fields={"arrival_s": "Timestamp", "prompt_tokens": "Request tokens",
                                               "output_tokens": "Response tokens", "tenant": "Model"},
                      optional=frozenset({"tenant"}), time_unit="s", sorted_input=True)
VIDUR = FormatSpec(name="vidur", fields={"arrival_s": "arrived_at", "prompt_tokens": "num_prefill_tokens",
                                         "output_tokens": "num_decode_tokens"},
                   time_unit="s", sorted_input=True)
# `vllm bench serve` per-request rows (its RequestFuncOutput: start_time is the client's perf_counter at
# the send, prompt_len, output_tokens, ttft, itl, success, error); rows arrive in completion order.
# The result JSON with per-request lists is read by traces.vllm_bench.
VLLM_BENCH_REQUESTS = FormatSpec(name="vllm_bench_requests",
                                 fields={"arrival_s": "start_time", "prompt_tokens": "prompt_len",
                                         "output_tokens": "output_tokens"}, time_unit="s")
# Lengths only: Vidur's processed traces (data/processed_traces/arxiv_summarization_stats_*.csv,
# bwb_stats_*.csv: num_prefill_tokens, num_decode_tokens, num_total_tokens, pd_ratio) hold one
# request per row and no arrival times; rows keep file order.
VIDUR_LENGTHS = FormatSpec(name="vidur_lengths", fields={"prompt_tokens": "num_prefill_tokens",
                                                         "output_tokens": "num_decode_tokens"})
KVCAP = FormatSpec(name="kvcap", fields={c: c for c in COLUMNS},
                   optional=frozenset({"priority", "tenant", "prefix_hashes"}),
                   time_unit="s", sorted_input=True, rebase=False)

KNOWN: dict[str, FormatSpec] = {s.name: s for s in (AZURE, MOONCAKE, BURSTGPT, VIDUR,
                                                     VLLM_BENCH_REQUESTS, KVCAP, VIDUR_LENGTHS)}
GENERIC_NAMES = ("csv", "jsonl", "parquet", "generic")
VLLM_BENCH = "vllm_bench"        # the result JSON (traces.vllm_bench), not column-mapped
FORMAT_NAMES = (*KNOWN, VLLM_BENCH, *GENERIC_NAMES)


def detect(src: Source) -> FormatSpec:
    """The known format whose signature columns the file has; else an error saying how to map it."""
    cols = set(src.columns)
    if src.kind == "parquet" and {"request_id", *REQUIRED_FIELDS} <= cols:
        return KVCAP
    for spec in (AZURE, MOONCAKE, BURSTGPT, VIDUR, VLLM_BENCH_REQUESTS):
        if {c for f, c in spec.fields.items() if f not in spec.optional} <= cols:
            return spec
    if set(REQUIRED_FIELDS) <= cols:
        # Canonical names in any file: seconds, made relative, sorted if needed.
        present = [c for c in COLUMNS if c in cols]
        return generic({c: c for c in present}, src=src, time_unit="s", timestamp_format=None)
    if {c for c in VIDUR_LENGTHS.fields.values()} <= cols:
        return VIDUR_LENGTHS
    if set(LENGTH_FIELDS) <= cols:
        # Canonical length columns and no arrival_s: lengths only.
        return generic({c: c for c in COLUMNS if c in cols}, src=src, time_unit=None,
                       timestamp_format=None)
    raise TraceError(f"{src.path}: unknown trace layout; columns found: {', '.join(src.columns)}. "
                     f"{_HOW_TO_MAP}")


_HOW_TO_MAP = ("Map them with --map COLUMN=FIELD for arrival_s, prompt_tokens, output_tokens "
               "(optional: request_id, priority, tenant, prefix_hashes) plus --time-unit s|ms|us "
               "or --timestamp-format FMT (in Python: load_trace(path, mapping={'COLUMN': 'arrival_s', "
               "...}, time_unit='s')), or name a format with --format "
               f"{'|'.join(KNOWN)}; a file of lengths only takes --arrivals poisson:RATE.")


def generic(mapping: Mapping[str, str], *, src: Source, time_unit: str | None,
            timestamp_format: str | None) -> FormatSpec:
    """A spec from a user mapping `{source column: canonical field}`."""
    fields: dict[str, str] = {}
    for column, field in mapping.items():
        if field not in REQUIRED_FIELDS + OPTIONAL_FIELDS:
            raise TraceError(f"{src.path}: mapping {column}={field}: unknown field {field!r}; "
                             f"fields: {', '.join(REQUIRED_FIELDS + OPTIONAL_FIELDS)}")
        if field in fields:
            raise TraceError(f"{src.path}: mapping: field {field!r} is mapped twice "
                             f"({fields[field]!r} and {column!r})")
        if column not in src.columns:
            raise TraceError(f"{src.path}, line 1, column '{column}': mapped column not found; "
                             f"columns found: {', '.join(src.columns)}")
        fields[field] = column
    missing = [f for f in LENGTH_FIELDS if f not in fields]
    if missing:
        raise TraceError(f"{src.path}: mapping lacks {', '.join(missing)}; columns found: "
                         f"{', '.join(src.columns)}. {_HOW_TO_MAP}")
    if "arrival_s" not in fields:        # lengths only: the loader asks for --arrivals
        if time_unit is not None or timestamp_format is not None:
            raise TraceError(f"{src.path}: --time-unit / --timestamp-format without a column "
                             "mapped to arrival_s; map one (--map COLUMN=arrival_s) or drop them")
        return FormatSpec(name="lengths", fields=fields)
    if time_unit is not None and time_unit not in TIME_UNITS_S:
        raise TraceError(f"unknown time unit {time_unit!r}; use one of {', '.join(TIME_UNITS_S)}")
    if time_unit is None and timestamp_format is None and fields["arrival_s"] != "arrival_s" \
            and src.kind != "parquet":
        raise TraceError(f"{src.path}, column '{fields['arrival_s']}': say how time is written: "
                         "--time-unit s|ms|us for numbers or --timestamp-format FMT (or auto) for text")
    # Parquet may hold native datetimes; numeric times there still need a unit (checked on read).
    unit = time_unit or ("s" if fields["arrival_s"] == "arrival_s" else None)
    return FormatSpec(name="generic", fields=fields, time_unit=unit, timestamp_format=timestamp_format)
