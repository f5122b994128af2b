"""Prometheus evidence -> one samples frame: text-exposition scrapes of vLLM's `/metrics` saved over
time, and Prometheus HTTP API `query_range` exports.

Inputs:
- a folder of scrapes, one file each (`curl -s host:8000/metrics > scrapes/$(date +%s).prom`), or one
  file of concatenated scrapes. A scrape's time is, in this order: the sample's own exposition
  timestamp; a comment line that is a time (`# 1747742400`, `# 2025-05-20T12:00:00Z`,
  `# scrape_time: ...`), which starts a new scrape; a Unix or ISO time in the file name. The text is
  parsed by `prometheus_client.parser` (types from `# TYPE`); a scrape ending in `# EOF` is
  OpenMetrics (`Accept: application/openmetrics-text`, timestamps in seconds) and is parsed by
  `prometheus_client.openmetrics.parser`.
- `query_range` JSON (`{"status": "success", "data": {"resultType": "matrix", "result": [...]}}`;
  also a list of them, or one per line). Types are not exported: `_total` is a counter, `_bucket` /
  `_sum` / `_count` next to a `_bucket` series a histogram, anything else a gauge.
Servers keep apart: a scrape folder or file is one server (its name); a query_range series is the
server of its `instance` label (else `pod`, else the file). Labels other than `le` stay with each
series (`labels`, JSON), and vLLM's `engine` and `model_name` get columns of their own.
Times are epoch seconds and naive UTC datetimes (the clock of all evidence).
Must not import duckdb, altair or replay.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

SAMPLE_SCHEMA = {
    "source_file": pl.Utf8, "server": pl.Utf8, "metric": pl.Utf8, "type": pl.Utf8, "part": pl.Utf8,
    "le": pl.Float64, "labels": pl.Utf8, "engine": pl.Utf8, "model_name": pl.Utf8,
    "epoch_s": pl.Float64, "time": pl.Datetime("us"), "value": pl.Float64,
}
_TIME_COMMENT = re.compile(r"^#\s*(?:[A-Za-z_ ]*[:=]\s*)?(\d{9,13}(?:\.\d+)?|\d{4}-\d{2}-\d{2}[T ][\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)\s*$")
_NAME_EPOCH = re.compile(r"(?<!\d)(\d{10}(?:\.\d+)?|\d{13})(?!\d)")
_NAME_ISO = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})[T_ -]?(\d{2})[:\-]?(\d{2})[:\-]?(\d{2})")
_HIST_PARTS = {"_bucket": "bucket", "_sum": "sum", "_count": "count"}


class PromFormatError(ValueError):
    """Prometheus input kvcap cannot read (one line naming the file and what is wrong)."""


# A label set: quoted values may hold any character, `}` and escaped quotes included.
_LABELS = r'\{(?:[^"}]|"(?:[^"\\\n]|\\.)*")*\}'


def looks_like_exposition(head: str) -> bool:
    return head.lstrip().startswith(("# HELP ", "# TYPE ")) or bool(
        re.search(rf"^vllm:\w+(?:{_LABELS})?\s+[-+0-9.eEInfNa]+", head, re.M))


def looks_like_query_range(head: str) -> bool:
    return '"resultType"' in head and '"result"' in head


def _epoch(text: str) -> float:
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        v = float(text)
        return v / 1000.0 if v > 1e11 else v      # milliseconds
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _name_time(name: str) -> float | None:
    m = _NAME_EPOCH.search(name)
    if m:
        return _epoch(m.group(1))
    m = _NAME_ISO.search(name)
    if m:
        y, mo, d, h, mi, s = (int(x) for x in m.groups())
        return datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()
    return None


def _labels_key(labels: dict) -> str:
    return json.dumps({k: labels[k] for k in sorted(labels) if k != "le"}, separators=(",", ":"))


def _row(source: str, server: str, metric: str, typ: str, part: str | None, labels: dict,
         t: float, value: float) -> tuple:
    le = labels.get("le")
    return (source, server, metric, typ, part, None if le is None else float(le), _labels_key(labels),
            labels.get("engine"), labels.get("model_name"), t, value)


def samples_frame(rows: list[tuple]) -> pl.DataFrame:
    """Rows of parse_exposition / the parsers -> a SAMPLE_SCHEMA frame, sorted by series and time."""
    cols = [c for c in SAMPLE_SCHEMA if c != "time"]
    df = pl.DataFrame(rows, schema={c: SAMPLE_SCHEMA[c] for c in cols}, orient="row")
    df = df.with_columns(time=(pl.col("epoch_s") * 1e6).cast(pl.Int64).cast(pl.Datetime("us")))
    return df.select(list(SAMPLE_SCHEMA)).sort("server", "metric", "labels", "le", "epoch_s", nulls_last=True)


def check_values(rows: list[tuple], where: str) -> None:
    """What a counter or a histogram can hold, over rows of one scrape (or one export): a counter
    and a histogram's buckets and count are finite and >= 0 (a counter that drops between
    scrapes is a restart, read as Prometheus' rate() does: see promseries; a negative one is no
    counter), and within one sample time the cumulative bucket counts never decrease as `le`
    grows. Raises PromFormatError naming the metric and its labels."""
    buckets: dict[tuple, list[tuple[float, float]]] = {}
    for _src, server, metric, typ, part, le, labels, _e, _m, t, value in rows:
        if typ == "counter" or (typ == "histogram" and part in ("bucket", "count")):
            if not 0.0 <= value < math.inf:
                what = "counter" if typ == "counter" else f"histogram _{part}"
                raise PromFormatError(f"{where}: {what} {metric}{_shown(labels, le)} is {value:g}; "
                                      "counts are finite numbers >= 0 (a counter only counts up from 0)")
            if part == "bucket":
                buckets.setdefault((server, metric, labels, t), []).append((le, value))
    for (server, metric, labels, t), pairs in buckets.items():
        pairs.sort(key=lambda p: p[0])
        for (le0, c0), (le1, c1) in zip(pairs, pairs[1:]):
            if c1 < c0:
                raise PromFormatError(
                    f"{where}: histogram {metric}{_shown(labels, None)}: bucket le=\"{le1:g}\" holds "
                    f"{c1:g}, less than {c0:g} of le=\"{le0:g}\"; bucket counts are cumulative and "
                    "never decrease as le grows")


def _shown(labels: str, le: float | None) -> str:
    d = json.loads(labels)
    if le is not None:
        d["le"] = f"{le:g}"
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}" if d else ""


def split_scrapes(text: str) -> list[tuple[float | None, str]]:
    """Concatenated scrapes -> [(time from its time comment or None, text)]."""
    parts: list[tuple[float | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        m = _TIME_COMMENT.match(line)
        if m:
            parts.append((_epoch(m.group(1)), []))
        else:
            parts[-1][1].append(line)
    return [(t, "\n".join(lines) + "\n") for t, lines in parts if any(l.strip() for l in lines)]


def parse_exposition(text: str, *, source: str, server: str, default_time: float | None) -> list[tuple]:
    """The samples of scrapes in `text` (see split_scrapes)."""
    rows: list[tuple] = []
    for n, (t_scrape, body) in enumerate(split_scrapes(text), 1):
        start = len(rows)
        parse = openmetrics_families if re.search(r"^# EOF\s*$", body, re.M) else text_string_to_metric_families
        try:
            families = list(parse(body))
        except (ValueError, TypeError, IndexError) as e:
            raise PromFormatError(f"{source}, scrape {n}: not Prometheus text exposition ({str(e)[:120]})") from None
        for fam in families:
            for s in fam.samples:
                t = float(s.timestamp) if s.timestamp is not None else (t_scrape if t_scrape is not None else default_time)
                if t is None:
                    raise PromFormatError(f"{source}, scrape {n}: no scrape time (put a '# <unix seconds>' or "
                                          "'# <ISO time>' line before each scrape, or a time in the file name)")
                if s.name.endswith("_created"):   # a counter's creation time, not a value
                    continue
                typ, metric, part = _classify(fam.type, fam.name, s.name)
                if typ == "histogram" and part is None:
                    continue
                rows.append(_row(source, server, metric, typ, part, s.labels, float(t), float(s.value)))
        check_values(rows[start:], f"{source}, scrape {n}")
    return rows


def _classify(fam_type: str, fam_name: str, sample: str) -> tuple[str, str, str | None]:
    if fam_type in ("histogram", "gaugehistogram"):
        return "histogram", fam_name, next((p for suf, p in _HIST_PARTS.items() if sample == fam_name + suf), None)
    if fam_type == "counter":
        return "counter", sample, None
    if fam_type == "gauge":
        return "gauge", sample, None
    return _infer(sample, set())


def _infer(name: str, names: set[str]) -> tuple[str, str, str | None]:
    """Type of a sample without a TYPE line (query_range exports carry none)."""
    for suf, part in _HIST_PARTS.items():
        base = name[: -len(suf)]
        if name.endswith(suf) and (suf == "_bucket" or base + "_bucket" in names):
            return "histogram", base, part
    if name.endswith("_total"):
        return "counter", name, None
    return "gauge", name, None


def parse_scrape_file(path: Path, *, source: str, server: str | None = None) -> pl.DataFrame:
    text = Path(path).read_text(errors="replace")
    return samples_frame(parse_exposition(text, source=source, server=server or Path(path).name,
                                   default_time=_name_time(Path(path).name)))


def parse_scrape_folder(folder: Path, *, source: str) -> pl.DataFrame:
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise PromFormatError(f"{folder}: an empty folder (expected one /metrics scrape per file)")
    rows: list[tuple] = []
    for p in files:
        try:
            rows += parse_exposition(p.read_text(errors="replace"), source=source, server=Path(folder).name,
                                     default_time=_name_time(p.name))
        except PromFormatError as e:      # name the file inside the folder
            raise PromFormatError(str(e).replace(f"{source}, ", f"{source}/{p.name}, ", 1)) from None
    return samples_frame(rows)


def parse_query_range(path: Path, *, source: str) -> pl.DataFrame:
    text = Path(path).read_text(errors="replace")
    try:
        docs = json.loads(text)
        docs = docs if isinstance(docs, list) else [docs]
    except json.JSONDecodeError:
        try:
            docs = [json.loads(l) for l in text.splitlines() if l.strip()]
        except json.JSONDecodeError as e:
            raise PromFormatError(f"{source}: invalid JSON ({e.msg})") from None
    series = []
    for i, doc in enumerate(docs, 1):
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PromFormatError(f"{source}, export {i}: not a query_range result (data.resultType must be "
                                  "'matrix')")
        result = data.get("result") or []
        if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
            raise PromFormatError(f"{source}, export {i}: data.result must be a list of series "
                                  "objects ({\"metric\": ..., \"values\": [[t, v], ...]})")
        series += result
    for k, s in enumerate(series):
        if not isinstance(s.get("metric") or {}, dict) or not isinstance(s.get("values") or [], list):
            raise PromFormatError(f"{source}, series {k}: 'metric' must be an object of labels and "
                                  "'values' a list of [time, value] pairs")
    names = {(s.get("metric") or {}).get("__name__") for s in series}
    rows: list[tuple] = []
    for k, s in enumerate(series):
        labels = {str(a): str(b) for a, b in (s.get("metric") or {}).items()}
        name = labels.pop("__name__", None)
        if name is None:
            raise PromFormatError(f"{source}, series {k}: no __name__; export the raw metrics (e.g. "
                                  "vllm:num_preemptions_total), not rate() or sum() of them")
        server = labels.pop("instance", None) or labels.get("pod") or source
        typ, metric, part = _infer(name, names)
        for pair in s.get("values") or []:
            try:
                t, v = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError):
                raise PromFormatError(f"{source}, series {k} ({name}): bad point {pair!r}") from None
            rows.append(_row(source, server, metric, typ, part, labels, t, v))
    if not rows:
        raise PromFormatError(f"{source}: the export holds no points")
    check_values(rows, source)
    return samples_frame(rows)
