"""TBT spike attribution (`kvcap attribute`): was a preemption logged when the client saw a stall?

A spike is a client ITL sample above a threshold; its gap is (token time - ITL, token time]. The
gap, widened by `window_s` on both sides (log timestamps have 1 s resolution and client and server
clocks differ), is matched against the server evidence, strongest first:
1. a V0 preemption warning inside the window (mode from the warning);
2. a stats interval overlapping the window with `Preemptions: P > 0` (V1 >= 0.14; recompute, the
   only V1 mode) or with swapped requests (V0; swap);
3. a V0 interval whose count estimated from the 1-in-50 warnings is > 0 ("likely"; mode of the
   nearest warning);
otherwise "not preemption - check network / load" when the logs cover the window, and "no server
log at this time" when they do not. Must not import altair.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from capacity.evidence.logparse import DEFAULT_INTERVAL_S
from capacity.evidence.logs import read_evidence, replace_table
from capacity.analyses.metrics import nearest_rank

NOT_PREEMPTION = "not preemption — check network / load"
VERDICTS = ("preemption", "likely preemption", NOT_PREEMPTION, "no server log at this time")
# Default threshold: this many times the median ITL of the client results.
THRESHOLD_X_MEDIAN = 5.0

_SQL = """
WITH s AS (SELECT *, gap_start_s - $w AS lo, gap_end_s + $w AS hi FROM spikes),
st AS (SELECT *, epoch_s - coalesce(interval_s, CASE era WHEN 'v0' THEN $d0 ELSE $d1 END) AS start_s
       FROM stats)
SELECT s.*,
  (SELECT count(*) FROM warns p WHERE p.epoch_s BETWEEN s.lo AND s.hi) AS warnings,
  (SELECT arg_min(p.mode, abs(p.epoch_s - (s.gap_start_s + s.gap_end_s) / 2)) FROM warns p
     WHERE p.epoch_s BETWEEN s.lo AND s.hi) AS warning_mode,
  (SELECT sum(preemptions)::BIGINT FROM st WHERE st.start_s < s.hi AND st.epoch_s > s.lo) AS logged_preemptions,
  (SELECT max(swapped) FROM st WHERE st.start_s < s.hi AND st.epoch_s > s.lo) AS max_swapped,
  (SELECT sum(preemptions_est) FROM st WHERE st.era = 'v0' AND st.start_s < s.hi AND st.epoch_s > s.lo)
     AS estimated_preemptions,
  (SELECT count(*) FROM st WHERE st.start_s < s.hi AND st.epoch_s > s.lo) AS covering_intervals,
  (SELECT arg_min(p.mode, abs(p.epoch_s - (s.gap_start_s + s.gap_end_s) / 2)) FROM warns p) AS nearest_mode,
  (SELECT min(abs(p.epoch_s - (s.gap_start_s + s.gap_end_s) / 2)) FROM warns p) AS nearest_warning_s
FROM s ORDER BY gap_end_s, client_source, request_id
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    threshold_s: float
    window_s: float
    itl_samples: int
    spikes: int
    untimed_spikes: int                 # client results without a wall-clock anchor
    verdicts: dict[str, int]
    modes: dict[str, int]
    table: pl.DataFrame                 # the `attribution` table

    def as_dict(self, max_rows: int = 500) -> dict:
        rows = self.table.head(max_rows).with_columns(pl.col("spike_time").cast(pl.Utf8)).to_dicts()
        return {"threshold_s": self.threshold_s, "window_s": self.window_s,
                "itl_samples": self.itl_samples, "spikes": self.spikes,
                "untimed_spikes": self.untimed_spikes, "verdicts": self.verdicts,
                "modes": self.modes, "table": "attribution", "rows": rows}


def attribute(db: Path, *, threshold_s: float | None = None, window_s: float = 2.0,
              server: str | None = None, client: str | None = None, store: bool = True) -> Attribution:
    """Attribute every client ITL spike; writes the `attribution` table when `store`."""
    if window_s < 0:
        raise ValueError(f"--window-s: must be >= 0, got {window_s}")
    ev = read_evidence(db, "client_tokens", "log_stats", "log_preemptions")
    tok, stats, warns = ev["client_tokens"], ev["log_stats"], ev["log_preemptions"]
    if client:
        tok = tok.filter(pl.col("source_file") == client)
    if server:
        stats = stats.filter(pl.col("source_file") == server)
        warns = warns.filter(pl.col("source_file") == server)
    itl = tok.filter(pl.col("itl_s").is_not_null())
    if itl.height == 0:
        raise ValueError(f"{db}: no client ITL samples; load client results with `kvcap logs`")
    if stats.height == 0 and warns.height == 0:
        raise ValueError(f"{db}: no server log lines; load a vLLM server log with `kvcap logs`")
    if threshold_s is None:
        threshold_s = THRESHOLD_X_MEDIAN * nearest_rank(itl["itl_s"].to_numpy(), 0.5)
    if threshold_s <= 0:
        raise ValueError(f"--threshold-s: must be > 0, got {threshold_s}")
    hot = itl.filter(pl.col("itl_s") > threshold_s)
    untimed = int(hot["token_epoch_s"].null_count())
    spikes = hot.filter(pl.col("token_epoch_s").is_not_null()).select(
        client_source=pl.col("source_file"), request_id=pl.col("request_id"),
        token_index=pl.col("token_index"), itl_s=pl.col("itl_s"),
        gap_start_s=pl.col("token_epoch_s") - pl.col("itl_s"), gap_end_s=pl.col("token_epoch_s"),
        spike_time=pl.col("token_time"))
    con = duckdb.connect()
    for name, df in (("spikes", spikes), ("stats", stats), ("warns", warns)):
        con.register(name, df.to_arrow())
    raw = con.sql(_SQL, params={"w": window_s, "d0": DEFAULT_INTERVAL_S["v0"],
                                "d1": DEFAULT_INTERVAL_S["v1"]}).pl()
    con.close()
    table = _verdicts(raw).with_columns(threshold_s=pl.lit(threshold_s), window_s=pl.lit(window_s))
    if store:
        replace_table(db, "attribution", table)
    counts = lambda col: {k: int(v) for k, v in table[col].value_counts().iter_rows()} if table.height else {}  # noqa: E731
    verdicts = {v: counts("verdict").get(v, 0) for v in VERDICTS}
    return Attribution(threshold_s=float(threshold_s), window_s=window_s, itl_samples=itl.height,
                       spikes=hot.height, untimed_spikes=untimed, verdicts=verdicts,
                       modes={k: v for k, v in counts("mode").items() if k is not None},
                       table=table)


def _verdicts(raw: pl.DataFrame) -> pl.DataFrame:
    c = pl.col
    warned = c("warnings") > 0
    logged = c("logged_preemptions").fill_null(0) > 0
    swapped = c("max_swapped").fill_null(0) > 0
    likely = c("estimated_preemptions").fill_null(0) > 0
    covered = c("covering_intervals") > 0
    return raw.with_columns(
        verdict=pl.when(warned | logged | swapped).then(pl.lit("preemption"))
        .when(likely).then(pl.lit("likely preemption"))
        .when(covered).then(pl.lit(NOT_PREEMPTION))
        .otherwise(pl.lit("no server log at this time")),
        evidence=pl.when(warned).then(pl.lit("warning line"))
        .when(logged).then(pl.lit("stats: Preemptions > 0"))
        .when(swapped).then(pl.lit("stats: Swapped > 0"))
        .when(likely).then(pl.lit("V0 counter between warnings")),
        mode=pl.when(warned).then(c("warning_mode"))
        .when(logged).then(pl.lit("recompute"))
        .when(swapped).then(pl.lit("swap"))
        .when(likely).then(c("nearest_mode")),
    ).drop("nearest_mode")
