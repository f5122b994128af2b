"""Parse vLLM server logs (V0 and V1 eras) into polars frames: stats, preemptions, unparsed lines.

Owns the line formats of reference A5 (the V0 preemption warning, 1 in 50 logged, with the
cumulative counter) and D2 (the periodic stats line of V0, V1 0.10/0.11 and V1 >= 0.14), the
logger's timestamp prefix, and the V0 preemption estimate derived from the warnings' counter.
Tolerant by design: unrelated lines, tracebacks and ANSI colour codes are skipped; a line that looks
like a stats line or a warning but does not parse is reported by number, never raised.
Pure functions over text; must not import duckdb, altair or replay.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable

import numpy as np
import polars as pl

from capacity.evidence.logfacts import (ENGINE_SCHEMA, EVENT_SCHEMA, FactError, engine_fields, event_kind,
                                        split_records)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# kubectl --timestamps, journald exports, Python's default logging format ...: a full date first.
ISO = re.compile(r"^\W{0,2}(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
                 r"(Z|[+-]\d{2}:?\d{2})?")
# vLLM's own formatter: "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s" with
# asctime "%m-%d %H:%M:%S" (older releases print "metrics.py:345]" without the opening bracket).
VLLM_PREFIX = re.compile(r"\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(\d{2})-(\d{2})\s+"
                         r"(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?\s+\[?[\w./-]+:\d+\]")
ENGINE = re.compile(r"Engine (\d+):\s*$")
# vLLM >= 0.10 prefixes each line with its process, "(APIServer pid=1234) INFO ...": several servers
# logging into one file (a shared journal) are told apart by it. `docker compose logs` puts the
# container first, "vllm-a-1  | (APIServer pid=1) ...": every container's server is often pid 1,
# so the container names the server there (its processes, a restart included, are one server).
PID = re.compile(r"\bpid=(\d+)\)")
SERVICE = re.compile(r"^([\w.-]+)\s+\|\s")
WARNING = re.compile(r"Sequence group (\S+) is preempted by (?:PreemptionMode\.)?(\w+) mode\b"
                     r"(?:.*?total_\w*preemption\w*=(\d+))?")

STATS_MARK = "Avg prompt throughput"
V0_PREFIX_MARK = "Prefix cache hit rate: GPU:"
WARNING_MARK = "is preempted by"

# One regex per comma-separated part of a stats line -> (column, kind). Percentages become 0..1.
_NUM = r"(-?\d+(?:\.\d+)?)"
PARTS = {
    "Avg prompt throughput": (re.compile(rf"{_NUM} tokens/s"), "prompt_throughput_tps", float),
    "Avg generation throughput": (re.compile(rf"{_NUM} tokens/s"), "generation_throughput_tps", float),
    "Running": (re.compile(r"(\d+) reqs?"), "running", int),
    "Swapped": (re.compile(r"(\d+) reqs?"), "swapped", int),
    "Pending": (re.compile(r"(\d+) reqs?"), "waiting", int),
    "Waiting": (re.compile(r"(\d+) reqs?"), "waiting", int),
    "Deferred": (re.compile(r"(\d+) reqs?"), "deferred", int),
    "Preemptions": (re.compile(r"(\d+)"), "preemptions", int),
    "GPU KV cache usage": (re.compile(rf"{_NUM}\s*%"), "gpu_kv_usage", "pct"),
    "CPU KV cache usage": (re.compile(rf"{_NUM}\s*%"), "cpu_kv_usage", "pct"),
    "Prefix cache hit rate": (re.compile(rf"{_NUM}\s*%"), "prefix_cache_hit_rate", "pct"),
}
_INT32_MAX = 2**31 - 1  # the stats columns are 32-bit (DuckDB INTEGER)
REQUIRED = ("prompt_throughput_tps", "generation_throughput_tps", "running", "waiting", "gpu_kv_usage")
# Stats logging interval when a row has no predecessor to measure it from (reference D2).
DEFAULT_INTERVAL_S = {"v0": 5.0, "v1": 10.0}

STATS_SCHEMA = {
    "source_file": pl.Utf8, "line": pl.Int64, "time": pl.Datetime("us"), "epoch_s": pl.Float64,
    "era": pl.Utf8, "engine": pl.Int32, "interval_s": pl.Float64, "running": pl.Int32,
    "waiting": pl.Int32, "swapped": pl.Int32, "deferred": pl.Int32, "gpu_kv_usage": pl.Float64,
    "cpu_kv_usage": pl.Float64, "prompt_throughput_tps": pl.Float64,
    "generation_throughput_tps": pl.Float64, "prefix_cache_hit_rate": pl.Float64,
    "cpu_prefix_cache_hit_rate": pl.Float64, "preemptions": pl.Int32,
    "preemptions_est": pl.Float64,
}
PREEMPTION_SCHEMA = {
    "source_file": pl.Utf8, "line": pl.Int64, "time": pl.Datetime("us"), "epoch_s": pl.Float64,
    "request_id": pl.Utf8, "mode": pl.Utf8, "cum_count": pl.Int64,
}
UNPARSED_SCHEMA = {"source_file": pl.Utf8, "line": pl.Int64, "reason": pl.Utf8, "text": pl.Utf8}


class StatsLineError(ValueError):
    """A candidate stats line that does not parse (the reason goes to `log_unparsed`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedLog:
    source_file: str
    lines: int
    stats: pl.DataFrame          # STATS_SCHEMA, one row per stats line (per engine)
    preemptions: pl.DataFrame    # PREEMPTION_SCHEMA, one row per logged warning
    unparsed: pl.DataFrame       # UNPARSED_SCHEMA, candidate lines that did not parse
    engine: pl.DataFrame         # logfacts.ENGINE_SCHEMA, one row per engine-configuration line
    events: pl.DataFrame         # logfacts.EVENT_SCHEMA, one row per engine error / abort line


def strip_ansi(line: str) -> str:
    return ANSI.sub("", line)


class Clock:
    """Turns a line's timestamp prefix into a naive datetime.

    vLLM's prefix has no year: `year` is used, and a month that goes backwards (Dec -> Jan) moves
    to the next year. ISO timestamps with an offset are converted to UTC (naive)."""

    def __init__(self, year: int):
        self.year = year
        self._last_month = 0

    def time(self, line: str) -> datetime | None:
        m = ISO.match(line)
        if m:
            y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
            t = datetime(y, mo, d, h, mi, s, int((m.group(7) or "0")[:6].ljust(6, "0")))
            if m.group(8) and m.group(8) != "Z":
                sign = 1 if m.group(8)[0] == "+" else -1
                hh, mm = int(m.group(8)[1:3]), int(m.group(8)[-2:])
                t -= sign * timedelta(hours=hh, minutes=mm)
            return t
        m = VLLM_PREFIX.search(line)
        if not m:
            return None
        mo, d, h, mi, s = (int(x) for x in m.groups()[:5])
        if mo < self._last_month:
            self.year += 1
        self._last_month = mo
        try:
            return datetime(self.year, mo, d, h, mi, s, int((m.group(6) or "0").ljust(6, "0")))
        except ValueError:
            return None


def epoch_s(t: datetime) -> float:
    """Seconds since 1970 of a naive datetime read as UTC (the one clock all evidence shares)."""
    return t.replace(tzinfo=timezone.utc).timestamp()


def parse_stats_body(body: str) -> dict:
    """The fields of one stats message (from "Avg prompt throughput" on). Unknown parts (KV fetch,
    External / MM cache hit rate, future fields) are ignored; a known field that does not parse, or
    a missing required one, raises StatsLineError."""
    row: dict = {}
    for part in body.strip().rstrip(".").split(","):
        name, sep, value = part.strip().partition(":")
        spec = PARTS.get(name.strip())
        if not sep or spec is None:
            continue
        rx, col, kind = spec
        m = rx.fullmatch(value.strip().rstrip("."))
        if not m:
            raise StatsLineError(f"bad value for {name.strip()!r}: {value.strip()!r}")
        v = m.group(1)
        if len(v) > 24:     # int() of thousands of digits raises; no real value has this many
            raise StatsLineError(f"{name.strip()!r}: {v[:24]}... is out of range")
        row[col] = float(v) / 100.0 if kind == "pct" else kind(float(v) if kind is float else v)
        if kind is int and not 0 <= row[col] <= _INT32_MAX:
            raise StatsLineError(f"{name.strip()!r}: {v} is out of range (0 to {_INT32_MAX})")
        if kind == "pct" and not 0.0 <= row[col] <= 1.0:
            raise StatsLineError(f"{name.strip()!r}: {v}% is not a percentage from 0 to 100")
        if kind is float and row[col] < 0:
            raise StatsLineError(f"{name.strip()!r}: {v} is negative")
    missing = [c for c in REQUIRED if c not in row]
    if missing:
        raise StatsLineError(f"stats line without {', '.join(missing)}")
    return row


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rows:
    """What one pass over a log collects (per-process clocks, then rows per table)."""
    year: int
    clocks: dict = field(default_factory=dict)
    stats: list = field(default_factory=list)
    tags: list = field(default_factory=list)         # per stats row, its server tag (or None)
    warns: list = field(default_factory=list)
    warn_tags: list = field(default_factory=list)
    bad: list = field(default_factory=list)
    engine: list = field(default_factory=list)
    engine_tags: list = field(default_factory=list)
    events: list = field(default_factory=list)
    event_tags: list = field(default_factory=list)
    last_stats: dict = field(default_factory=dict)   # tag -> its latest stats row (V0 prefix line)


def parse_server_log(lines: Iterable[str], source_file: str, year: int) -> ParsedLog:
    """Parse a vLLM server log. Line numbers are 1-based; records glued into one line (lost
    newlines) keep its number. Lines of several servers keep apart, told by their tag: the
    docker compose container (`name  | `) where there is one, else the process (`pid=`). Each
    has its own clock (year roll-over) and its own V0 prefix-cache line; when a file holds more
    than one, their rows get the source `FILE service=NAME` / `FILE pid=N`. Engine and error
    lines follow their own tag when two servers log at the same time (their lines interleave;
    a restart, one server after the other, keeps them under FILE: the last start-up states the
    engine). A preemption warning pasted without its timestamp still counts (time NULL)."""
    acc = _Rows(year=year)
    n = 0
    for n, raw in enumerate(lines, 1):
        text = strip_ansi(raw.rstrip("\r\n"))
        sm = SERVICE.match(text)
        for line in split_records(text):
            _parse_record(line, n, source_file, acc, sm.group(1) if sm else None)
    tags, warn_tags = acc.tags, acc.warn_tags
    st = pl.DataFrame(acc.stats, schema={k: v for k, v in STATS_SCHEMA.items()
                                         if k not in ("interval_s", "preemptions_est")}, strict=False)
    pre = pl.DataFrame(acc.warns, schema=PREEMPTION_SCHEMA, orient="row")
    engine = pl.DataFrame(acc.engine, schema=ENGINE_SCHEMA, strict=False)
    events = pl.DataFrame(acc.events, schema=EVENT_SCHEMA, strict=False)
    if len(set(tags + warn_tags)) > 1:
        st = st.with_columns(source_file=pl.Series(_tag_sources(source_file, tags), dtype=pl.Utf8))
        pre = pre.with_columns(source_file=pl.Series(_tag_sources(source_file, warn_tags), dtype=pl.Utf8))
        parts = [_finish_stats(st.filter(pl.col("source_file") == s), pre.filter(pl.col("source_file") == s))
                 for s in sorted(set(st["source_file"].to_list()))]
        st = pl.concat(parts).sort("line", "epoch_s") if parts else _finish_stats(st, pre)
        if _interleaved([r["line"] for r in acc.stats] + [w[1] for w in acc.warns], tags + warn_tags):
            engine = engine.with_columns(source_file=pl.Series(
                _tag_sources(source_file, acc.engine_tags), dtype=pl.Utf8))
            events = events.with_columns(source_file=pl.Series(
                _tag_sources(source_file, acc.event_tags), dtype=pl.Utf8))
    else:
        st = _finish_stats(st, pre)
    return ParsedLog(source_file=source_file, lines=n, stats=st, preemptions=pre,
                     unparsed=pl.DataFrame(acc.bad, schema=UNPARSED_SCHEMA, orient="row"),
                     engine=engine, events=events)


def _interleaved(lines: list[int], tags: list) -> bool:
    """Whether two tags' line ranges overlap (servers logging at the same time, not one after
    the other). `lines` and `tags` are in file order (per row)."""
    spans: dict = {}
    for line, tag in zip(lines, tags):
        a, b = spans.get(tag, (line, line))
        spans[tag] = (min(a, line), max(b, line))
    ranges = sorted(spans.values())
    return any(b0 >= a1 for (_, b0), (a1, _) in zip(ranges, ranges[1:]))


def _parse_record(line: str, n: int, source_file: str, acc: _Rows, service: str | None = None) -> None:
    is_stats, is_prefix, is_warn = STATS_MARK in line, V0_PREFIX_MARK in line, WARNING_MARK in line
    if is_stats and is_warn:
        # A warning and a stats record glued without a logger prefix between them: each is read
        # (the stats record keeps the warning's time, the only one on the line).
        i, j = line.index(STATS_MARK), line.index(WARNING_MARK)
        if j < i:
            prefix = VLLM_PREFIX.search(line[:j])
            _parse_record(line[:i], n, source_file, acc, service)
            _parse_record((line[:prefix.end()] + " " if prefix else "") + line[i:], n, source_file, acc,
                          service)
            return
        _parse_record(line[:j], n, source_file, acc, service)    # stats first: the warning has no time
        _parse_record(line[j:], n, source_file, acc, service)
        return
    try:
        facts = None if (is_stats or is_warn) else engine_fields(line)
    except FactError as e:
        acc.bad.append((source_file, n, f"engine line: {e}", line[:300]))
        return
    kind = None if (is_stats or is_warn or facts) else event_kind(line)
    if not (is_stats or is_prefix or is_warn or facts or kind):
        return
    pm = PID.search(line[:200])
    pid = pm.group(1) if pm else None
    tag = f"service={service}" if service else f"pid={pid}" if pid else None
    t = acc.clocks.setdefault(tag, Clock(acc.year)).time(line)
    when = {"time": t, "epoch_s": epoch_s(t) if t else None, "pid": int(pid) if pid else None}
    if facts is not None:
        acc.engine.append({"source_file": source_file, "line": n, **when, **facts, "text": line[:300]})
        acc.engine_tags.append(tag)
    elif kind is not None:
        acc.events.append({"source_file": source_file, "line": n, **when, "kind": kind, "text": line[:300]})
        acc.event_tags.append(tag)
    elif is_warn:
        m = WARNING.search(line)
        if not m or m.group(2).lower() not in ("recompute", "swap"):
            acc.bad.append((source_file, n, "preemption warning does not parse", line[:300]))
            return
        if m.group(3) and len(m.group(3)) > 15:   # far beyond any server's life (Int64 column)
            acc.bad.append((source_file, n, f"preemption counter {m.group(3)[:20]}... is out of range",
                            line[:300]))
            return
        acc.warns.append((source_file, n, t, when["epoch_s"], m.group(1), m.group(2).lower(),
                          int(m.group(3)) if m.group(3) else None))
        acc.warn_tags.append(tag)
    elif t is None:
        acc.bad.append((source_file, n, "no timestamp", line[:300]))
    elif is_prefix:
        _attach_v0_prefix(acc.last_stats.get(tag), line, source_file, n, t, acc.bad)
    else:
        i = line.index(STATS_MARK)
        eng = ENGINE.search(line[:i])
        try:
            row = parse_stats_body(line[i:])
        except StatsLineError as e:
            acc.bad.append((source_file, n, str(e), line[:300]))
            return
        v0 = "swapped" in row or "cpu_kv_usage" in row or "Pending:" in line
        row.update(source_file=source_file, line=n, time=t, epoch_s=epoch_s(t),
                   era="v0" if v0 and eng is None else "v1",
                   engine=int(eng.group(1)) if eng else 0)
        acc.stats.append(row)
        acc.tags.append(tag)
        acc.last_stats[tag] = row


def _tag_sources(source_file: str, tags: list[str | None]) -> list[str]:
    return [source_file if t is None else f"{source_file} {t}" for t in tags]


def _attach_v0_prefix(prev: dict | None, line: str, source: str, n: int, t: datetime, bad: list) -> None:
    """V0 logs the prefix cache hit rate as a second line right after its stats line (of the
    same server: `prev`, its latest stats row)."""
    m = re.search(rf"GPU:\s*{_NUM}\s*%,\s*CPU:\s*{_NUM}\s*%", line)
    if not m:
        bad.append((source, n, "prefix cache line does not parse", line[:300]))
    elif prev is None or prev["era"] != "v0" or abs((t - prev["time"]).total_seconds()) > 1.0:
        bad.append((source, n, "prefix cache line without its stats line", line[:300]))
    else:
        prev["prefix_cache_hit_rate"] = float(m.group(1)) / 100.0
        prev["cpu_prefix_cache_hit_rate"] = float(m.group(2)) / 100.0


def _finish_stats(st: pl.DataFrame, pre: pl.DataFrame) -> pl.DataFrame:
    """Interval lengths, V1 preemption counts (0 when the field is omitted in a >= 0.14 log) and
    the V0 estimate from the warnings' cumulative counter."""
    if st.height == 0:
        return pl.DataFrame(schema=STATS_SCHEMA)
    key = ["source_file", "engine"]
    st = st.sort([*key, "line", "epoch_s"]).with_columns(
        interval_s=pl.col("epoch_s").diff().over(key),
        # V1 >= 0.14 prints "Preemptions: P" only when P > 0: in a log that shows the field at
        # all, a line without it means 0; in an older log it means "not reported".
        preemptions=pl.when(pl.col("preemptions").is_not_null().any().over(key))
        .then(pl.col("preemptions").fill_null(0)).otherwise(pl.col("preemptions")))
    est = np.full(st.height, np.nan)
    v0 = (st["era"] == "v0").to_numpy()
    timed = pre.filter(pl.col("epoch_s").is_not_null())  # an untimed warning places no counter value
    if v0.any() and timed.height:
        est[v0] = v0_preemption_estimate(st.filter(pl.col("era") == "v0")["epoch_s"].to_numpy(),
                                         timed["epoch_s"].to_numpy(), timed["cum_count"].to_numpy())
    st = st.with_columns(preemptions_est=pl.Series(est).fill_nan(None))
    st = st.with_columns(preemptions_est=pl.coalesce(pl.col("preemptions").cast(pl.Float64),
                                                     pl.col("preemptions_est")))
    return st.select([pl.col(c).cast(t) for c, t in STATS_SCHEMA.items()])


def cumulative_at(t: np.ndarray, warn_t: np.ndarray, warn_cum: np.ndarray) -> np.ndarray:
    """Estimated cumulative preemption count at times `t` from the logged warnings.

    The counter is exact at each warning; between two warnings of one process it is interpolated
    linearly (the 49 silent preemptions are spread evenly); before the log's first warning it is 0
    when that warning is the process's first preemption (counter 1). After the last warning of a
    process (the counter drops at a restart) it is unknown (NaN)."""
    out = np.full(len(t), np.nan)
    wc = np.asarray(warn_cum, dtype=np.float64)
    ok = ~np.isnan(wc)
    wt, wc = np.asarray(warn_t, dtype=np.float64)[ok], wc[ok]
    if len(wt) == 0:
        return out
    order = np.argsort(wt, kind="stable")
    wt, wc = wt[order], wc[order]
    starts = np.r_[0, np.flatnonzero(np.diff(wc) <= 0) + 1]
    ends = np.r_[starts[1:], len(wt)]
    for k, (a, b) in enumerate(zip(starts, ends)):
        seg_t, seg_c = wt[a:b], wc[a:b]
        inside = (t >= seg_t[0]) & (t <= seg_t[-1])
        out[inside] = np.interp(t[inside], seg_t, seg_c)
        # Before a restart's first warning the old process may still have been preempting: unknown.
        if k == 0 and seg_c[0] == 1:
            out[t < seg_t[0]] = 0.0
    return out


def v0_preemption_estimate(stats_t: np.ndarray, warn_t: np.ndarray, warn_cum) -> np.ndarray:
    """Preemptions per stats interval (previous stats line, this one], estimated (see cumulative_at)."""
    warn_cum = np.array([np.nan if c is None else c for c in warn_cum], dtype=np.float64)
    c = cumulative_at(stats_t, warn_t, warn_cum)
    prev = np.r_[0.0 if len(c) and c[0] == 0 else np.nan, c[:-1]]
    return np.maximum(c - prev, 0.0) if len(c) else c
