"""`kvcap calibrate`: measure step shapes with the torch stub on a device and fit the cost model.

Owns the measurement grid (prefill tokens, prefill chunks over context, decode batch x context,
mixed steps, swap-out / swap-in block counts, plain pinned host<->device copies for reference, and
V1 offloading store / load copies of the largest swap's block count, reported beside them),
the fit and the profile JSON that `CostConstants.with_profile` reads.

The fit keeps the cost model's own formula (docs/cost-model.md) with efficiencies set to 1, so the
fitted rates are effective rates:

    step_s = overhead_s + max(flops / flops_per_s, bytes / hbm_bytes_per_s) + swap_bytes / host_link

`host_link_bytes_per_s` comes from the measured swap copies alone (least squares on bytes). The
rest is least squares on relative error, alternating with the choice of the binding roofline term
per shape (started as: prefill compute-bound, decode memory-bound) until it settles. Every third
shape of each family is held out; the report gives the mean absolute % error there, predicted by a
`CostModel` built from the profile itself (so the JSON is checked end to end).

Imports torch, numpy, replay's engine modules and traces.atomic (standard library only) only:
the GPU machine has no polars/duckdb.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from replay.config import EngineConfig, resolve
from replay.engine.plan import StepPlan
from replay.engine.prefix import UniqueBlockKeys
from replay.engine.spec import cdiv
from replay.engine.state import RequestState
from replay.stub.executor import StubExecutor, compute_dtype, kv_dtype
from replay.stub.kv import KVLayout, PagedKV
from replay.stub.model import StubShape, StubShapeName, WeightlessModel
from replay.timing.cost_model import CostModel, ModelShape
from replay.timing.executors import catalog_constants
from traces import atomic


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationOptions:
    device: str | None = None                 # "cuda" | "cpu"; default: cuda when present
    model: str = "llama-3.1-8b"
    gpu: str = "h100"                          # catalog GPU (the constants not fitted come from it)
    stub_shape: StubShapeName | None = None    # default: full on CUDA, tiny on the CPU
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    quick: bool = False
    repeats: int | None = None                 # timed repeats per shape (median taken)
    seed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepShape:
    family: str                                 # prefill | chunk | decode | mixed | swap_out | swap_in
    rows: tuple[tuple[int, int], ...] = ()      # (new tokens, context tokens) per row
    swap_blocks: int = 0

    @property
    def label(self) -> str:
        if self.family in ("swap_out", "swap_in"):
            return f"{self.family} {self.swap_blocks} blocks"
        if self.family == "decode":
            return f"decode b={len(self.rows)} ctx={self.rows[0][1]}"
        return f"{self.family} " + "+".join(f"{n}@{c}" for n, c in self.rows[:3]) + \
            (f"+{len(self.rows) - 3} rows" if len(self.rows) > 3 else "")


# ------------------------------------------------------------------------------------ the grid
def grid(*, quick: bool, max_model_len: int) -> list[StepShape]:
    if quick:
        prefill, chunks = [32, 128, 512], [(128, 256), (256, 512)]
        decode = [(b, c) for b in (1, 8, 32) for c in (64, 512)]
        mixed = [((256, 0), (1, 256), 8)]
        swaps = [4, 16, 64]
    else:
        prefill, chunks = [128, 256, 512, 1024, 2048, 4096, 8192], \
            [(512, 2048), (1024, 4096), (2048, 2048), (2048, 6144), (512, 8192), (4096, 4096)]
        decode = [(b, c) for b in (1, 4, 16, 32, 64, 128, 256) for c in (256, 1024, 4096)
                  if b * c <= 262_144]
        decode += [(8, 16_384), (2, 32_768)]
        mixed = [((2048, 0), (1, 1024), 64), ((512, 1024), (1, 2048), 32),
                 ((1024, 0), (1, 512), 128)]
        swaps = [16, 64, 256, 1024]
    out = [StepShape(family="prefill", rows=((n, 0),)) for n in prefill]
    out += [StepShape(family="chunk", rows=((n, c),)) for n, c in chunks]
    out += [StepShape(family="decode", rows=((1, c),) * b) for b, c in decode
            if c + 1 <= max_model_len]
    out += [StepShape(family="mixed", rows=(pre,) + (dec,) * b) for pre, dec, b in mixed]
    # A swap step also decodes one short request (the engine never copies without a forward).
    out += [StepShape(family=f, rows=((1, 128),), swap_blocks=n) for n in swaps
            for f in ("swap_out", "swap_in")]
    return out


def _heldout(shapes: list[StepShape]) -> list[bool]:
    """Every third shape of each family (the second of each group of three) is held out."""
    seen: dict[str, int] = {}
    out = []
    for s in shapes:
        i = seen.get(s.family, 0)
        seen[s.family] = i + 1
        out.append(i % 3 == 1)
    return out


# ------------------------------------------------------------------------------------ measuring
@dataclass(slots=True, kw_only=True)
class _Bench:
    """A stub with synthetic block tables: one PagedKV sized for the largest shape."""
    ex: StubExecutor
    tables: dict[int, list[int]]
    perm: np.ndarray
    B: int


def _blocks_needed(s: StepShape, B: int) -> int:
    return sum(cdiv(n + c, B) for n, c in s.rows)


def _bench(eng, shape: StubShape, dev: torch.device, shapes: list[StepShape], seed: int) -> _Bench:
    B = eng.spec.block_size
    max_rows = max(len(s.rows) for s in shapes)
    n_gpu = max(_blocks_needed(s, B) + s.swap_blocks for s in shapes) + 1
    n_cpu = max(max(s.swap_blocks for s in shapes), 1)
    layout = KVLayout(num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
                      head_dim=shape.head_dim, block_size=B, num_gpu_blocks=n_gpu,
                      num_cpu_blocks=n_cpu,
                      dtype=kv_dtype(eng.config.kv_cache_dtype, eng.model.weight_dtype_bytes))
    kv = PagedKV(layout, dev)
    model = WeightlessModel(shape, dev, compute_dtype(dev), seed=seed)
    # Every row samples: prompt = its whole length, nothing generated yet.
    state = RequestState(arrival_s=np.zeros(max_rows), prompt_len=np.full(max_rows, 1 << 30),
                         output_len=np.ones(max_rows))
    tables: dict[int, list[int]] = {}
    ex = StubExecutor(kv=kv, model=model, keys=UniqueBlockKeys(), state=state,
                      block_table=lambda r: tables[r], timing="measured", check=False)
    # A shuffled pool: block tables are as scattered as a long-running engine's.
    perm = np.random.default_rng(seed).permutation(n_gpu)
    return _Bench(ex=ex, tables=tables, perm=perm, B=B)


def _plan(bench: _Bench, s: StepShape) -> StepPlan:
    B, perm, st = bench.B, bench.perm, bench.ex.state
    bench.tables.clear()
    used = 0
    for r, (n, c) in enumerate(s.rows):
        nb = cdiv(n + c, B)
        bench.tables[r] = perm[used:used + nb].tolist()
        used += nb
        st.prompt_len[r] = n + c          # the chunk reaches the end: the row samples
    k = s.swap_blocks
    gpu = perm[used:used + k]
    cpu = np.arange(k)
    pairs_out = np.stack([gpu, cpu], 1) if s.family == "swap_out" else np.zeros((0, 2), np.int64)
    pairs_in = np.stack([cpu, gpu], 1) if s.family == "swap_in" else np.zeros((0, 2), np.int64)
    rows = np.arange(len(s.rows), dtype=np.int64)
    new = np.array([n for n, _ in s.rows], np.int64)
    return StepPlan(rows=rows, num_new_tokens=new,
                    num_computed_tokens=np.array([c for _, c in s.rows], np.int64),
                    is_prefill=new > 1, swap_out=pairs_out.astype(np.int64),
                    swap_in=pairs_in.astype(np.int64))


def _time_copies(dev: torch.device, nbytes: int, repeats: int) -> dict:
    """Plain host<->device copy of one contiguous (pinned on CUDA) buffer, GB/s each way."""
    pin = dev.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    devbuf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out = {}
    for name, dst, src in (("d2h", host, devbuf), ("h2d", devbuf, host)):
        times = []
        for _ in range(repeats + 1):
            times.append(_timed(dev, lambda: dst.copy_(src, non_blocking=True)))
        out[f"pinned_{name}_gb_per_s"] = nbytes / float(np.median(times[1:])) / 1e9
    return out


def _time_offload(bench: _Bench, n: int, repeats: int) -> dict:
    """V1 offloading copies of n scattered blocks (the stub's store and load path, on the copy
    stream as in a replay), GB/s each way: the median (GPU) or fastest (CPU) of the repeats."""
    kv = bench.ex.kv
    gpu, host = bench.perm[:n].astype(np.int64), np.arange(n, dtype=np.int64)
    none = np.zeros((0, 2), np.int64)
    out = {}
    for name, stores, loads in (("store", np.column_stack((gpu, host)), none),
                                ("load", none, np.column_stack((host, gpu)))):
        kv.offload_copies.clear()
        for _ in range(repeats + 1):
            kv.offload(stores, loads, wait=True)
        secs = [c[3] for c in kv.offload_seconds()[1:]]
        stat = np.median if kv.cuda else np.min
        out[f"offload_{name}_gb_per_s"] = n * kv.layout.block_bytes / float(stat(secs)) / 1e9
    out["offload_blocks"] = n
    kv.offload_copies.clear()
    kv.settle()
    return out


def _timed(dev: torch.device, fn: Callable[[], object]) -> float:
    if dev.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        return a.elapsed_time(b) / 1e3
    t0 = time.perf_counter(); fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------ features
def stub_cost_model(eng, shape: StubShape, layout: KVLayout,
                    constants: dict | None = None) -> CostModel:
    """The cost model of the model the stub really runs (its own dims and KV bytes), with the
    catalog constants. For `full` it is the engine's model; for `tiny` it keeps the fit physical
    (rates of this device), so the profile's rates carry over to the real model's formula."""
    s = shape
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    per_layer = s.hidden_size * (q + 2 * kv) + q * s.hidden_size + 3 * s.hidden_size * s.intermediate_size
    elem = torch.empty(0, dtype=compute_dtype(torch.device("cuda"))).element_size()
    layer_params = s.num_layers * per_layer
    ms = ModelShape(num_layers=s.num_layers, hidden_size=s.hidden_size,
                    num_attention_heads=s.num_heads, head_dim=s.head_dim,
                    vocab_size=s.vocab_size, num_layer_params=layer_params,
                    weight_bytes=(layer_params + s.hidden_size * s.vocab_size) * elem)
    per_token = layout.block_bytes // layout.block_size
    consts = catalog_constants(eng.gpu)
    if constants:
        consts = replace(consts, **constants)
    return CostModel(shape=ms, constants=consts, tp=1,
                     kv_bytes_per_token=per_token, kv_bytes_per_block=layout.block_bytes)


def _features(cm: CostModel, plan: StepPlan) -> tuple[float, float, float]:
    """(flops, bytes, swap_bytes) of a plan in the cost model's own terms (tp = 1)."""
    n, c = plan.num_new_tokens, plan.num_computed_tokens
    tokens = int(n.sum())
    attn = int((n * c).sum() + (n * (n + 1) // 2).sum())
    kv = int(c.sum()) + tokens
    flops = tokens * cm._linear_per_token + len(n) * cm._lm_head_per_sample + attn * cm._attn_per_unit
    nbytes = cm._weight_bytes + kv * cm.kv_bytes_per_token
    swap = (len(plan.swap_out) + len(plan.swap_in)) * cm.kv_bytes_per_block
    return float(flops), float(nbytes), float(swap)


def fit_constants(flops, nbytes, swap_bytes, t, swap_t, compute_bound0) -> dict:
    """Fit overhead, effective FLOP/s, effective bytes/s (shapes without swaps) and host-link
    bytes/s (measured swap copies). Arrays are aligned per shape; see the module docstring."""
    flops, nbytes, t = map(np.asarray, (flops, nbytes, t))
    sb, st = np.asarray(swap_bytes, float), np.asarray(swap_t, float)
    has = sb > 0
    if has.sum() >= 2:
        slope = np.polyfit(sb[has], st[has], 1)[0]
        host = 1.0 / slope if slope > 0 else float(sb[has].sum() / st[has].sum())
    elif has.any():
        host = float(sb[has].sum() / st[has].sum())
    else:
        host = float("nan")
    base = ~has
    f, b, y = flops[base], nbytes[base], t[base]
    comp = np.asarray(compute_bound0)[base].copy()
    w = 1.0 / y                                            # least squares on relative error
    coef = np.array([0.0, 0.0, 0.0])
    for _ in range(20):
        X = np.stack([np.ones_like(y), f * comp, b * ~comp], 1)
        coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
        if coef[0] < 0:                                     # no negative overhead: refit without
            coef = np.concatenate(([0.0], np.linalg.lstsq(X[:, 1:] * w[:, None], y * w,
                                                          rcond=None)[0]))
        inv_f = coef[1] if coef[1] > 0 else float(np.median(y / f))
        inv_b = coef[2] if coef[2] > 0 else float(np.median(y / b))
        new = f * inv_f > b * inv_b
        if np.array_equal(new, comp) or new.all() or (~new).all():
            break
        comp = new
    out = {"overhead_s": float(coef[0]), "flops_per_s": float(1.0 / inv_f),
           "hbm_bytes_per_s": float(1.0 / inv_b), "host_link_bytes_per_s": float(host),
           "compute_efficiency": 1.0, "memory_efficiency": 1.0}
    # Without swap measurements the host link is unknown: leave the catalog value (a NaN in the
    # profile would make every replay that reads it spin on NaN step times).
    return {k: v for k, v in out.items() if np.isfinite(v) and (v > 0 or k == "overhead_s")}


# ------------------------------------------------------------------------------------ calibrate
def calibrate(opts: CalibrationOptions = CalibrationOptions(),
              log: Callable[[str], None] | None = None) -> dict:
    """Measure the grid on `opts.device`, fit, and return the profile (a JSON-ready dict)."""
    log = log or (lambda msg: None)
    dev = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda requested but torch sees no CUDA device; use --device cpu")
    shape_name = opts.stub_shape or ("full" if dev.type == "cuda" else "tiny")
    repeats = opts.repeats or (3 if opts.quick else 5)
    probe = resolve(EngineConfig(model=opts.model, gpu=opts.gpu, block_size=opts.block_size,
                                 kv_cache_dtype=opts.kv_cache_dtype, num_gpu_blocks_override=2,
                                 num_cpu_blocks_override=0))
    shapes = grid(quick=opts.quick, max_model_len=probe.spec.max_model_len)
    shape = StubShape.for_model(probe.model, 1, shape_name)
    torch.manual_seed(opts.seed)
    bench = _bench(probe, shape, dev, shapes, opts.seed)
    cm = stub_cost_model(probe, shape, bench.ex.kv.layout)
    rows = []
    t_start = time.perf_counter()
    for s in shapes:
        plan = _plan(bench, s)
        times, swaps, gapless = [], [], []
        for i in range(repeats + 1):                         # the first run warms up
            bench.ex.step_s(plan, len(s.rows))
            if i:
                times.append(bench.ex.last_measured_s)
                swaps.append(bench.ex.last_swap_s)
                gapless.append(bench.ex.last_gapless)
        # A GPU is ours alone: the median. A shared CPU is disturbed by others: the fastest run.
        stat = np.median if dev.type == "cuda" else np.min
        flops, nbytes, sbytes = _features(cm, plan)
        rows.append({"family": s.family, "label": s.label, "rows": [list(r) for r in s.rows],
                     "swap_blocks": s.swap_blocks, "measured_s": float(stat(times)),
                     "swap_s": float(stat(swaps)), "flops": flops, "bytes": nbytes,
                     "swap_bytes": sbytes, "num_tokens": int(plan.num_new_tokens.sum()),
                     "gapless": sum(gapless) / len(gapless)})
        log(f"{s.label:<40} {rows[-1]['measured_s'] * 1e3:9.3f} ms")
    held = _heldout(shapes)
    train = [r for r, h in zip(rows, held) if not h]
    consts = fit_constants([r["flops"] for r in train], [r["bytes"] for r in train],
                           [r["swap_bytes"] for r in train], [r["measured_s"] for r in train],
                           [r["swap_s"] for r in train],
                           [r["family"] in ("prefill", "chunk", "mixed") for r in train])
    fitted = CostModel(shape=cm.shape, constants=replace(cm.constants, **consts), tp=1,
                       kv_bytes_per_token=cm.kv_bytes_per_token,
                       kv_bytes_per_block=cm.kv_bytes_per_block)
    for r, s, h in zip(rows, shapes, held):
        r["heldout"] = h
        r["predicted_s"] = fitted.step_s(_plan(bench, s), len(s.rows))
        r["error_pct"] = 100.0 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    block_bytes = bench.ex.kv.layout.block_bytes
    bandwidth = _bandwidths(rows, block_bytes)
    biggest = max(s.swap_blocks for s in shapes)
    bandwidth.update(_time_copies(dev, max(biggest, 1) * block_bytes, repeats))
    if biggest:
        bandwidth.update(_time_offload(bench, biggest, repeats))
    for d, p in (("swap_out", "d2h"), ("swap_in", "h2d"), ("offload_store", "d2h"),
                 ("offload_load", "h2d")):
        if f"{d}_gb_per_s" in bandwidth:
            bandwidth[f"{d}_vs_pinned"] = (bandwidth[f"{d}_gb_per_s"]
                                           / bandwidth[f"pinned_{p}_gb_per_s"])
    mape = lambda rs: float(np.mean([abs(r["error_pct"]) for r in rs])) if rs else float("nan")  # noqa: E731
    test = [r for r in rows if r["heldout"]]
    return {
        "constants": consts,
        "device": {"type": dev.type, "name": (torch.cuda.get_device_name(dev) if dev.type == "cuda"
                                              else "cpu"), "torch": torch.__version__},
        "model": probe.model.name, "gpu": probe.gpu.name,
        "shape": asdict(shape), "kv": {"block_size": probe.spec.block_size,
                                       "stub_block_bytes": block_bytes,
                                       "engine_block_bytes": probe.kv_bytes_per_block,
                                       "dtype": str(bench.ex.kv.layout.dtype)},
        "fit": {"method": "least squares on relative error, roofline term chosen per shape; "
                          "host link from the swap copies alone",
                "mape_heldout_pct": mape(test), "mape_train_pct": mape(train),
                "max_abs_error_heldout_pct": max((abs(r["error_pct"]) for r in test), default=0.0),
                "num_train": len(train), "num_heldout": len(test), "repeats": repeats,
                "quick": opts.quick, "seconds": time.perf_counter() - t_start,
                # Timed runs whose kernels ran without waiting for Python (replay.stub.clock).
                "gapless_pct": 100.0 * float(np.mean([r["gapless"] for r in rows]))},
        "bandwidth": bandwidth,
        "measurements": rows,
    }


def _bandwidths(rows: list[dict], block_bytes: int) -> dict:
    """Swap copy GB/s (stub bytes really moved / measured swap time) at the largest count."""
    out = {}
    for d in ("out", "in"):
        rs = [r for r in rows if r["family"] == f"swap_{d}"]
        if rs:
            r = max(rs, key=lambda r: r["swap_blocks"])
            out[f"swap_{d}_gb_per_s"] = r["swap_blocks"] * block_bytes / r["swap_s"] / 1e9
            out[f"swap_{d}_blocks"] = r["swap_blocks"]
    return out


def write_profile(profile: dict, path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"-o: {path} is a directory; give a file name such as {path / 'profile.json'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(profile, indent=1) + "\n")
    return path
