"""Run every command of one scenario and cache each outcome as JSON.

`ScenarioRun(scenario, root).run_all()` writes the scenario's trace under root/traces and each
command's outcome (argv, exit code, stdout JSON, stderr tail, wall time, derived numbers) to
root/<scenario>/<label>.json. An outcome is reused while its argv, the scenario, HARNESS_VERSION and
the product code (a hash of capacity/, replay/, traces/) are unchanged, so re-checking invariants
is cheap.

Commands (all with the scenario's engine and SLO flags, --json, --workers 1): report (+ its
summary.json), plan, headroom; replay of the recommended flags (at 1x, at the headroom rate scale,
and with half the recommended --kv-offloading-size); fleet with N and N-1 replicas; compare-modes,
tune, size-offload, size-swap, alerts. A flag a command does not take is recorded as "unsupported"
(the command is not run), never a crash of the harness.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from answers.corpus import REPO, Scenario, flag_value, trace_path

KVCAP = Path(sys.executable).with_name("kvcap")
if not KVCAP.exists():
    KVCAP = REPO / ".venv" / "bin" / "kvcap"
TIMEOUT_S = float(os.environ.get("KVCAP_ANSWERS_TIMEOUT_S", 400))
WORKERS = os.environ.get("KVCAP_ANSWERS_WORKERS", "1")


def default_root() -> Path:
    return Path(os.environ.get("KVCAP_ANSWERS_CACHE", Path(tempfile.gettempdir()) / "kvcap-answers"))


HARNESS_VERSION = 5    # bump when what an outcome records changes (invalidates the cache)


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """Hash of the product code: a cached outcome is stale once it changes."""
    h = hashlib.sha256()
    for top in ("capacity", "replay", "traces"):
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc", ".o"):
                h.update(str(p.relative_to(REPO)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Outcome:
    label: str
    argv: list[str]
    rc: int | None = None             # None: not run (unsupported / skipped)
    out: dict | None = None           # stdout parsed as one JSON object
    stdout_tail: str = ""
    stderr_tail: str = ""
    wall_s: float = 0.0
    timed_out: bool = False
    skipped: str = ""                 # why it was not run
    traceback: bool = False           # stderr holds a Python traceback (plain or rich)
    extra: dict = field(default_factory=dict)   # derived: summary.json, evaluate(), metrics
    key: str = ""

    @property
    def ran(self) -> bool:
        return self.rc is not None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.out is not None

    def error_line(self) -> str:
        lines = [ln for ln in self.stderr_tail.strip().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else (f"exit {self.rc}" if self.rc else "")


# ---------------------------------------------------------------------------- the CLI's options
@functools.lru_cache(maxsize=None)
def help_text(command: str) -> str:
    """`kvcap COMMAND --help` on a wide terminal, so no option name is cut."""
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb", "NO_COLOR": "1"}
    return subprocess.run([str(KVCAP), command, "--help"], capture_output=True, text=True, env=env,
                          timeout=120).stdout


def options(command: str) -> frozenset[str]:
    """The long options the command takes."""
    return frozenset(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text(command)))


ALIASES = {"-tp": "--tensor-parallel-size"}


def parse_flags(argv) -> list[tuple[str, str | None]]:
    """argv tokens -> [(option, value or None for a switch)] in order."""
    items, i, argv = [], 0, list(argv)
    while i < len(argv):
        tok = ALIASES.get(argv[i], argv[i])
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            items.append((tok, argv[i + 1]))
            i += 2
        else:
            items.append((tok, None))
            i += 1
    return items


def _switch_key(opt: str) -> str:
    return "--" + opt[len("--no-"):] if opt.startswith("--no-") else opt


def merge_flags(*argvs) -> list[str]:
    """Later argv lists override earlier ones option by option (--x / --no-x are one option)."""
    merged: dict[str, tuple[str, str | None]] = {}
    for argv in argvs:
        for opt, val in parse_flags(argv):
            merged[_switch_key(opt) if val is None else opt] = (opt, val)
    return [t for opt, val in merged.values() for t in ((opt,) if val is None else (opt, val))]


def filter_flags(command: str, argv, *, required: bool) -> tuple[list[str], list[str]]:
    """(the flags `command` takes, the options it does not). `required` = engine flags: an option
    it does not take makes the command unsupported; otherwise (SLO flags) it is dropped."""
    known = options(command)
    kept, missing = [], []
    for opt, val in parse_flags(argv):
        if opt in known:
            kept += [opt] if val is None else [opt, val]
        else:
            missing.append(opt)
    return kept, (missing if required else [])


# ---------------------------------------------------------------------------- one scenario
class ScenarioRun:
    def __init__(self, scenario: Scenario, root: Path | None = None, *, fresh: bool = False,
                 cached_only: bool = False, timeout_s: float = TIMEOUT_S, log=None):
        self.s = scenario
        self.root = Path(root or default_root())
        self.dir = self.root / scenario.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fresh = fresh
        self.cached_only = cached_only      # re-check: take every cached outcome as it is, run nothing
        self.timeout_s = timeout_s
        self.log = log or (lambda msg: None)
        self.outcomes: dict[str, Outcome] = {}
        self._trace: Path | None = None

    # -- plumbing
    @property
    def trace(self) -> Path:
        if self._trace is None:
            self._trace = trace_path(self.s.trace, self.root / "traces")
        return self._trace

    def _key(self, argv: list[str]) -> str:
        text = json.dumps([code_hash(), HARNESS_VERSION, repr(self.s), argv])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def run(self, label: str, command: str, args: list[str], *, engine=(), slo=(), extra_flags=(),
            prepare=None, derive=None, drop=()) -> Outcome:
        """Run `kvcap COMMAND args <engine> <slo> <extra> --json [--workers 1]`, cached by argv;
        `drop`: options taken out of the engine flags first (a plan's `drop_flags`)."""
        engine = [t for opt, val in parse_flags(engine) if opt not in drop
                  for t in ((opt,) if val is None else (opt, val))]
        eng, missing = filter_flags(command, merge_flags(engine, extra_flags), required=True)
        slo_kept, _ = filter_flags(command, slo, required=False)
        argv = [command, *map(str, args), *eng, *slo_kept, "--json"]
        if "--workers" in options(command):
            argv += ["--workers", WORKERS]
        key = self._key(argv)
        path = self.dir / f"{label}.json"
        if not self.fresh and path.exists():
            try:
                cached = Outcome(**json.loads(path.read_text()))
                if cached.key == key or self.cached_only:
                    self.outcomes[label] = cached
                    return cached
            except (TypeError, ValueError):
                pass
        if self.cached_only:
            o = Outcome(label, argv, skipped="not in the cache", key=key)
            self.outcomes[label] = o
            return o
        if missing:
            o = Outcome(label, argv, skipped=f"not supported: {command} does not take "
                                             f"{', '.join(missing)}", key=key)
        else:
            if prepare:
                prepare()
            o = self._execute(label, argv, key)
            if derive and o.ok:
                try:
                    o.extra.update(derive(o))
                except Exception as e:  # the product API under test may be in flux
                    o.extra["derive_error"] = f"{type(e).__name__}: {e}"[:400]
        path.write_text(json.dumps(asdict(o), default=str))
        self.outcomes[label] = o
        return o

    def _execute(self, label: str, argv: list[str], key: str) -> Outcome:
        self.log(f"{self.s.name}: {label}")
        env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
        t0 = time.perf_counter()
        try:
            res = subprocess.run([str(KVCAP), *argv], cwd=self.dir, capture_output=True, text=True,
                                 timeout=self.timeout_s, env=env)
            rc, stdout, stderr, timed_out = res.returncode, res.stdout, res.stderr, False
        except subprocess.TimeoutExpired as e:
            rc, timed_out = -9, True
            stdout = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        wall = time.perf_counter() - t0
        out = None
        try:
            parsed = json.loads(stdout)
            out = parsed if isinstance(parsed, dict) else None
        except ValueError:
            pass
        return Outcome(label, argv, rc=rc, out=out, stdout_tail=stdout[-2000:] if out is None else "",
                       stderr_tail=stderr[-3000:], wall_s=round(wall, 2), timed_out=timed_out,
                       traceback="Traceback (most recent call last)" in stderr, key=key)

    # -- the commands
    def run_all(self) -> dict[str, Outcome]:
        s, trace, slo = self.s, str(self.trace), self.s.slo_flags
        rep_dir = self.dir / "report"

        def summary(o: Outcome) -> dict:
            p = rep_dir / "summary.json"
            return {"summary": json.loads(p.read_text()) if p.exists() else None}

        report = self.run("report", "report", [trace, "-o", rep_dir], engine=s.engine, slo=slo,
                          prepare=lambda: shutil.rmtree(rep_dir, ignore_errors=True),
                          derive=summary)
        self.run("plan", "plan", [trace], engine=s.engine, slo=slo)
        self.run("headroom", "headroom", [trace], engine=s.engine, slo=slo)
        r = report.out or {}
        rec = r.get("recommendation") or {}
        flags = [str(t) for t in (rec.get("flags") or [])]
        drop = [str(t) for t in (rec.get("drop_flags") or [])]
        self.replay("replay-default", [])
        self.replay("replay-flags", flags, drop=drop)
        scale = r.get("headroom_rate_scale")
        if r.get("capacity_rps") is not None and isinstance(scale, (int, float)) and scale > 0:
            self.replay("replay-margin", flags, ("--rate-scale", f"{scale!r}"), drop=drop)
        gib = r.get("recommended_kv_offloading_size_gib")
        if isinstance(gib, (int, float)) and gib > 0:    # the size itself, then half of it
            for label, size in (("replay-offload-full", gib), ("replay-offload-half", gib / 2)):
                self.replay(label, merge_flags(flags, ("--kv-offloading-size", f"{size:g}")),
                            drop=drop)
        replicas = r.get("replicas") if isinstance(r.get("replicas"), dict) else {}
        n, router = replicas.get("count"), replicas.get("router") or "lor"
        if isinstance(n, int) and n >= 1:
            for label, k in (("fleet-n", n), ("fleet-n-1", n - 1)):
                if k >= 1:
                    self.run(label, "fleet", [trace, "--replicas", k, "--router", router],
                             engine=s.engine, slo=slo, extra_flags=flags, drop=drop)
        self.run("compare-modes", "compare-modes", [trace], engine=s.engine, slo=slo)
        self.run("tune", "tune", [trace, *self._tune_grid()], engine=s.engine, slo=slo)
        self.run("size-offload", "size-offload", [trace], engine=s.engine, slo=slo)
        self.run("size-swap", "size-swap", [trace], engine=s.engine, slo=slo)
        self.run("alerts", "alerts", [trace, "-o", self.dir / "rules.yml"], engine=s.engine, slo=slo)
        return self.outcomes

    def _tune_grid(self) -> list[str]:
        """tune's own default grid when it has one; while it requires --max-num-seqs-grid, the
        report's documented default (1/8, 1/4, 1/2, 1 x the engine's max-num-seqs)."""
        if not re.search(r"--max-num-seqs-grid[^\n]*\[required\]", help_text("tune")):
            return []
        top = int(flag_value(self.s.engine, "--max-num-seqs") or (256 if self.s.scheduler == "v0"
                                                                 else 1024))
        return ["--max-num-seqs-grid", ",".join(str(max(1, top // d)) for d in (8, 4, 2, 1))]

    def replay(self, label: str, flags, extra=(), drop=()) -> Outcome:
        db = self.dir / f"{label}.duckdb"
        return self.run(label, "replay", [str(self.trace), "--db", db, *extra], engine=self.s.engine,
                        extra_flags=flags, drop=drop, prepare=lambda: db.unlink(missing_ok=True),
                        derive=lambda o: evaluate_run(db, o.out.get("run_id"), self.s))


def evaluate_run(db: Path, run_id: str, s: Scenario) -> dict:
    """The replay's engine config (runs table) and capacity.analyses.criteria.evaluate on it,
    with the metrics a plan's objective may name."""
    from capacity.analyses.criteria import Budget, evaluate
    from replay.results.store import read_table
    tables = {t: read_table(db, t, run_id) for t in ("runs", "requests", "steps", "events", "tbt")}
    c = evaluate(tables, slo_ttft_s=s.slo_ttft_s, slo_tbt_s=s.slo_tbt_s, budget=Budget.parse(s.budget))
    req, run = tables["requests"], tables["runs"].row(0, named=True)
    config = {k: run.get(k) for k in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks",
                                      "num_cpu_blocks", "preemption_mode", "kv_offloading")}
    try:  # the version defaults the run resolved to
        from replay.config import EngineConfig, resolve
        spec = resolve(EngineConfig(**json.loads(run["config_json"]))).spec
        config["enable_prefix_caching"] = bool(spec.enable_prefix_caching)
        config["enable_chunked_prefill"] = bool(spec.enable_chunked_prefill)
    except Exception as e:
        config["resolve_error"] = f"{type(e).__name__}: {e}"[:200]
    ev = {k: getattr(c, k) for k in ("meets_slo", "within_budget", "sustainable", "feasible",
                                     "breaks", "ttft_p99_s", "tbt_p99_s", "preemptions",
                                     "goodput_rps", "throughput_rps", "slo_share",
                                     "preemption_verdict")}
    ev["recomputed_tokens"] = int(req["recomputed_tokens"].sum() or 0)
    ev["prefill_tokens"] = int(tables["steps"]["num_prefill_tokens"].sum() or 0)
    return {"config": config, "evaluate": ev}
