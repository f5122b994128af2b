"""Make kvcap's shipped step-time profiles and docs/timing.md from NVIDIA AIConfigurator's data.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python tools/aic_profiles.py --wheel /tmp/aic/aiconfigurator_core-0.12.0-*.whl

writes replay/timing/profiles/<gpu>--<model>--bf16--tp<N>.json for every catalog GPU x model x TP the
database covers (the model fits the GPUs, its head counts per GPU were measured), and
docs/timing.md: the step-time error of kvcap's measured model (replay/timing/step_profile.py, the Python
reference) against steps composed from measured kernels at points held OUT of the tables it was
given (the held-out batch sizes, contexts, token counts and prompt lengths are removed from the
knots before the error is computed; the shipped profiles keep every knot). `make timing-doc` runs
both. AIConfigurator is a development tool here, never a runtime dependency of kvcap.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from aic_source import SYSTEMS, Kernels, Source, fill_grid, open_wheel  # noqa: E402
from replay.timing import catalog  # noqa: E402
from replay.timing.step_profile import (FORMAT, MAX_COLS_2D, MAX_KNOTS_1D,  # noqa: E402
                                        MAX_ROWS_2D, PROFILE_DIR, dtype_key, parse_tables,
                                        profile_name, step_aggregates)

TPS = (1, 2, 4, 8)
# kvcap's kv_cache_dtype -> the source's (its fp8 is e4m3, vLLM's "fp8" on CUDA).
KV_DTYPES = {"auto": "bfloat16", "fp8": "fp8"}


def every_third(values, pairs: bool = False) -> set:
    """The validation's held-out knots of one table axis: the second of every three measured
    values (index 1, 4, 7, ... in order; never the first or the last, so a held-out value always
    lies between two kept ones and nothing is extrapolated). With `pairs`, token counts m and
    m + 1 (the source measures both sides of the GEMM tile boundaries from 32 up) count as one."""
    units: list[list] = []
    for v in sorted(set(values)):
        if pairs and units and len(units[-1]) == 1 and units[-1][0] == v - 1 and v > 32:
            units[-1].append(v)
        else:
            units.append([v])
    return {v for i, u in enumerate(units) if i % 3 == 1 and i < len(units) - 1 for v in u}


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """The knots held out of the validation's tables, per table axis (every_third of each)."""
    tokens: set[int]                  # GEMM token counts (linear_s, lm_head_s)
    allreduce_tokens: set[float]      # all-reduce message sizes, in tokens
    decode_batch: set[int]
    context: set[int]
    prefill_batch: set[int]
    prompt: set[int]


def held_out(k: Kernels) -> Held:
    return Held(tokens=every_third(token_knots(k), pairs=True),
                allreduce_tokens=(every_third(x for x, _ in k.allreduce_knots())
                                  if k.tp > 1 else set()),
                decode_batch=every_third(b for b, _ in k.generation),
                context=every_third(c for _, c in k.generation),
                prefill_batch=every_third(b for b, _ in k.context),
                prompt=every_third(n for _, n in k.context))


def token_knots(k: Kernels) -> list[int]:
    """Every token count at which the source measured all of the step's GEMMs (1..17, then m and
    m + 1 either side of the kernels' tile boundaries on most systems: time jumps there)."""
    return [m for m in k.gemm_m if _measured(k, m)]


def _sig(x: float) -> float:
    return float(f"{x:.5g}")


def _measured(k: Kernels, tokens: int) -> bool:
    """Every GEMM of the step measured at this m (some systems lack a few shapes)."""
    try:
        k.linear_s(tokens), k.lm_head_s(tokens)
        return True
    except KeyError:
        return False


def monotone(grid: list[list[float]]) -> list[list[float]]:
    """The grid made non-decreasing in batch (rows) and in length (cols): each cell the fastest
    measurement at that or a larger batch and length. An attention kernel does no less work for
    more rows or a longer context, so a cell slower than a bigger one is a measurement artifact
    (the source has some, e.g. A100 TP8 decode at context 8: 1.43 ms at batch 1, 0.40 at batch 2)."""
    out = [list(r) for r in grid]
    for i in range(len(out) - 1, -1, -1):
        for j in range(len(out[i]) - 1, -1, -1):
            if i + 1 < len(out):
                out[i][j] = min(out[i][j], out[i + 1][j])
            if j + 1 < len(out[i]):
                out[i][j] = min(out[i][j], out[i][j + 1])
    return out


def build(k: Kernels, src: Source, gpu: str, model, tp: int, *, hold: bool) -> dict:
    """One profile as a JSON object (`hold`: without the validation's held-out knots)."""
    h = held_out(k)
    tokens = [t for t in token_knots(k) if not (hold and t in h.tokens)]
    assert len(tokens) <= MAX_KNOTS_1D

    def grid(cells, held_rows, held_cols):
        rows = sorted({b for b, _ in cells if not (hold and b in held_rows)})
        cols = sorted({x for _, x in cells if not (hold and x in held_cols)})
        rows, cols = rows[:MAX_ROWS_2D], cols[-MAX_COLS_2D:]
        g, filled = fill_grid(cells, rows, cols)
        g = monotone(g)
        return {"rows": rows, "cols": cols,
                "s": [[_sig(model.num_layers * t / 1e3) for t in line] for line in g]}, filled

    pre, pre_filled = grid(k.context, h.prefill_batch, h.prompt)
    dec, dec_filled = grid(k.generation, h.decode_batch, h.context)
    tables = {
        "linear_s": {"x": tokens, "s": [_sig(k.linear_s(t)) for t in tokens]},
        "lm_head_s": {"x": tokens, "s": [_sig(k.lm_head_s(t)) for t in tokens]},
        "prefill_attention_s": pre,
        "decode_attention_s": dec,
    }
    if tp > 1:
        ar = [(x, y) for x, y in k.allreduce_knots() if not (hold and x in h.allreduce_tokens)]
        tables["allreduce_s"] = {"x": [_sig(x) for x, _ in ar], "s": [_sig(y) for _, y in ar]}
    kv = next(a for a, b in KV_DTYPES.items() if b == k.kv_cache_dtype)
    name = profile_name(gpu, model.name, dtype_key(2, kv), tp)
    return {
        "format": FORMAT, "name": name, "gpu": gpu, "model": model.name, "dtype": "bf16",
        "kv_cache_dtype": kv, "tensor_parallel_size": tp,
        "source": {
            "name": "NVIDIA AIConfigurator perf database", "package": src.package,
            "version": src.version, "licence": src.licence,
            "url": "https://github.com/ai-dynamo/aiconfigurator",
            "system": k.system, "framework": "vllm", "framework_version": k.vllm_version,
            "attention_kernels": k.attention_kernel,
            "not_measured": "elementwise kernels (bytes / 0.8 HBM, AIConfigurator's rule) in "
                            "linear_s; GEMM widths between measured n/k interpolated linearly; "
                            f"{pre_filled} prefill and {dec_filled} decode attention cells the "
                            "source lacks, their column's last measured segment extended in batch "
                            "(never steeper than in proportion); attention "
                            "cells slower than a larger batch or length lowered to it (artifacts); no "
                            "CPU-side step overhead (overhead_s = 0: calibrate it)",
        },
        "constants": {"overhead_s": 0.0, "overhead_per_row_s": 0.0, "kernel_scale": 1.0},
        "tables": tables,
    }


def covered(src: Source):
    """(gpu, model, tp, kv_cache_dtype, Kernels) for every combination the database measures."""
    for kv, source_kv in KV_DTYPES.items():
        for gpu in SYSTEMS:
            g = catalog.get_gpu(gpu)
            for model in catalog._MODELS:
                for tp in TPS:
                    if model.weight_bytes / tp > 0.8 * g.memory_bytes:
                        continue
                    try:
                        k = Kernels(src, gpu, model, tp, g.hbm_bandwidth_bytes_per_s, source_kv)
                        yield gpu, model, tp, kv, k
                    except (LookupError, KeyError) as exc:
                        print(f"skip {gpu} {model.name} tp{tp} kv {kv}: {exc}", file=sys.stderr)


# ------------------------------------------------------------------ validation
def heldout_points(k: Kernels):
    """(kind, description, new tokens per row, computed per row, reference seconds): steps
    composed from measured kernels only, each at a point held out of the validation tables."""
    m_ok = {m for m in k.gemm_m if _measured(k, m)}
    h = held_out(k)

    def step(new, ctx, t_attn):
        t = sum(new)
        return k.linear_s(t) + k.lm_head_s(len(new)) + k.allreduce_s(t) + t_attn

    ar_x = [x for x, _ in k.allreduce_knots()] if k.tp > 1 else []
    ar_gaps = [(ar_x[i - 1], ar_x[i + 1]) for i, x in enumerate(ar_x) if x in h.allreduce_tokens]

    def tok(t):
        """The token count is a held-out knot of the GEMM tables or its all-reduce message lies
        between the kept neighbours of a held-out message size."""
        return t in h.tokens or any(a < t < b for a, b in ar_gaps)

    # A point is held out when any of its table lookups (tokens, sampling rows, batch, context
    # or prompt length) falls on a held-out knot.
    for (b, c), _ in sorted(k.generation.items()):
        if (tok(b) or b in h.decode_batch or c in h.context) and b in m_ok:
            yield ("decode", f"batch {b} x context {c}", [1] * b, [c - 1] * b,
                   step([1] * b, None, k.decode_attention_s(b, c)))
    for (b, n), _ in sorted(k.context.items()):
        if (tok(b * n) or b in h.tokens or b in h.prefill_batch or n in h.prompt) \
                and b * n in m_ok and b in m_ok:
            yield ("prefill", f"{b} x {n}-token prompts", [n] * b, [0] * b,
                   step([n] * b, None, k.prefill_attention_s(b, n)))
    for n in (256, 512, 1024, 2048, 4096):
        for b in (1, 16, 256, 512):
            for c in sorted({x for (bb, x) in k.generation if bb == b}):
                if n + b not in m_ok or b + 1 not in m_ok or (1, n) not in k.context:
                    continue
                if not (tok(n + b) or b + 1 in h.tokens or b in h.decode_batch
                        or c in h.context or n in h.prompt):
                    continue
                yield ("mixed", f"{n}-token prompt + {b} decodes at context {c}",
                       [n] + [1] * b, [0] + [c - 1] * b,
                       step([n] + [1] * b, None, k.prefill_attention_s(1, n)
                            + k.decode_attention_s(b, c)))


def _roofline(gpu: str, model, tp: int, kv: str):
    """kvcap's analytic cost model with catalog constants (the default before profiles)."""
    from replay.timing import memory
    from replay.timing.cost_model import CostModel
    from replay.timing.executors import catalog_constants, model_shape
    return CostModel(shape=model_shape(model), constants=catalog_constants(catalog.get_gpu(gpu)),
                     tp=tp, kv_bytes_per_token=memory.kv_bytes_per_token(model, tp, kv),
                     kv_bytes_per_block=0)


def validate(k: Kernels, profile: dict, roofline) -> list[tuple[str, str, float, float, float]]:
    """(kind, point, reference s, measured model s, roofline s) per held-out point."""
    mt = parse_tables(profile, profile["name"])
    out = []
    for kind, what, new, ctx, ref in heldout_points(k):
        got = mt.step_s(sum(new), len(new), *step_aggregates(new, ctx), 0, 0.0)
        attn = sum(n * c + n * (n + 1) // 2 for n, c in zip(new, ctx))
        old = roofline._step_s(sum(new), len(new), attn, sum(ctx) + sum(new), 0)
        out.append((kind, what, ref, got, old))
    return out


def _pct(rows, i):
    errs = [abs(r[i] - r[2]) / r[2] for r in rows]
    return 100 * statistics.median(errs), 100 * max(errs), errs


HEADER = """# Step-time fidelity

Generated by `make timing-doc` (tools/aic_profiles.py); do not edit by hand.

## The step model

With a measured profile (the default wherever one ships: replay/timing/profiles/, chosen by GPU x
model x dtype x TP), one engine step costs

```
step_s = overhead_s + rows * overhead_per_row_s
         + kernel_scale * ( linear(T) + allreduce(T)          T  = scheduled tokens
                          + lm_head(S)                        S  = rows that sample
                          + prefill_attention(Bp, L_eq)       Bp = rows with > 1 new token
                          + decode_attention(Bd, Kd / Bd) )   Bd = rows with 1 new token
         + swap_blocks * block_bytes / host_link_bytes_per_s
```

Kd is the decode rows' KV length (computed + 1) summed; a prefill row of n new tokens on c
cached ones does causal work n(c + (n + 1) / 2), and the prefill rows are priced at the equal-work
length L_eq = (sqrt(1 + 8 A / Bp) - 1) / 2 per row for their summed work A. Every part is a
table of seconds for the whole model on one GPU of the TP group, interpolated piecewise linearly
in the value (bilinearly in 2-D; below the first knot its value, past the last the last segment
extended), with no logarithms so that the compiled core (replay/engine/kvcore.h `cost_measured_s`) and
the Python reference (replay/timing/step_profile.py `MeasuredTables.step_s`) agree bit for bit. Where
no profile ships (other GPUs, models whose per-GPU head counts the source did not measure, an
fp8 KV cache on A100, whose source tables are bf16 only, or `fp8_e5m2`) the analytic roofline of
docs/cost-model.md prices the step, with a one-line warning on stderr. An fp8 KV cache
(`--kv-cache-dtype fp8` or `fp8_e4m3`) has profiles of its own, `<gpu>--<model>--bf16-fp8kv--tp<N>`:
the same GEMM and all-reduce tables, attention measured reading an fp8 (e4m3) KV cache (about
0.6x the bf16 time at long contexts on H100, 0.5x on L40S).

The tables come from {source}: NVIDIA AIConfigurator's database of vLLM kernels measured on each
GPU ({licence}). Per layer: the QKV, output, gate/up and down GEMMs (bf16) at the step's token
count, FlashAttention for prefill (batch x prompt length) and decode (batch x context), two
custom all-reduces under TP (their table's knots are the source's measured message sizes, so
the profile reproduces every measurement and interpolates between them as AIConfigurator does);
the lm_head GEMM once for the sampling rows. Not measured there, and
said in each profile's `source.not_measured`: the bandwidth-bound elementwise kernels (norms,
activation, embedding: AIConfigurator's bytes / 0.8 HBM rule, folded into `linear`), GEMM widths
between measured n/k (linear in n and k, as AIConfigurator does), attention cells the source ran
out of memory for (the column's last measured segment extended in batch, never steeper than
in proportion to the batch), and the CPU-side step overhead
(`overhead_s` = 0 in the shipped profiles: vLLM's V1 engine overlaps most of it; fit it with
`kvcap calibrate --from-bench` below). The attention tables are made non-decreasing in batch and
length, each cell the fastest measurement at that or a larger batch and length: an attention
kernel does no less work for more rows or a longer context, so a slower cell is a measurement
artifact (the source has some: A100 TP8 decode at context 8 measures 1.43 ms at batch 1 and
0.40 ms at batch 2). The validation below compares with the raw measurements.

## What changes against the roofline

The measured kernels run one after another, as they do in vLLM; the roofline took the larger of
compute and memory time for the whole step (as if the GEMMs overlapped the KV reads) and added
3 ms. On an H100 with Llama-3.1-8B, steps at small and medium batch get cheaper (decode batch 1 at
2,048 context: 9.1 -> 5.9 ms; a 2,048-token prefill: 53 -> 43 ms, the GEMMs reach about 720 of the
989 dense TFLOP/s), while KV-heavy mixed steps cost more (1,153 tokens with 336 decodes at 1.4k
context: 31 -> 44 ms: 19 ms of it reading 60 GB of KV). A trace that fills the KV cache therefore
saturates somewhat earlier than the roofline said (the built-in flash-crowd scenario at twice its
rate, `kvcap replay --rate-scale 2`: 24.0 instead of 26.0 req/s served).

## Calibrating to a server

`kvcap calibrate --from-bench RESULT.json -o PROFILE.json --gpu GPU [--tp N --max-num-seqs ...]`
reads a `vllm bench serve --save-result --save-detailed` result (`start_times`, `input_lens`,
`output_lens`, `ttfts`, `itls`), replays those requests as sent on the shipped profile and fits
`overhead_s` and `kernel_scale` by least squares on the relative per-request TPOT errors,
replaying again with the fit until the two settle. It reports the replayed vs observed median
TPOT and per-request TPOT / TTFT errors, and writes the profile (`--calibration PROFILE.json`
accepts it) only when the median TPOT is within `--max-error-pct` (5 %); otherwise it says so
and exits 1. TTFT is reported, not fitted (a request's TTFT hangs on which step it arrived in).

`kvcap calibrate --from-logs SERVER.log --trace TRACE -o PROFILE.json --gpu GPU [--tp N ...]`
fits a server's log instead, when the trace it served is known. A stats line gives the
interval's prompt and generation throughput and the requests running at its end, but no request
ids, so the trace is first placed on the log's clock: the offset whose replayed prompt tokens per
interval (counted at each request's first token, as vLLM counts them) best match the logged
prompt throughput. Below saturation the generation throughput is what the clients asked for,
whatever the step time; what the step time decides is how many requests run at once (Little's
law). So the fit is the `kernel_scale` at which the replay runs as many requests at the logged
instants as the server did (geometric bisection, one replay per probe; placed again with the
fitted replay when the queue moved the first tokens), with the profile's `overhead_s` kept: 5-10 s
averages cannot separate the two constants, and the scale absorbs a small overhead. It refuses
(exit 1, nothing written) when no scale in the profile's range matches or when the median stats
line's running count is off by more than `--max-error-pct` (15 %); a data-parallel log (several
engines) is refused, its split of the trace is unknown. On a log synthesised from a replay with
`kernel_scale` 1.15 it recovers 1.149 (4 req/s) and 1.171 (10 req/s, queueing throughout).

## Against this project's own measured steps on a GPU

The validation below compares the step model with AIConfigurator's kernel measurements, not with
a step this project ran. `bench/gpu_calibrate.sh` (docs/stub.md, "The GPU check") replays Azure
conv requests on the torch stub on a GPU and prices every step it ran with the shipped profile of
that GPU: mean, p95 and signed error per step, decode-only, with prefill, and weight-bound decode
(context KV under a quarter of the weights' bytes). That last row is the check of the profile: the
stub's GEMMs are a real engine's, while its attention gathers the KV through the block tables (a
few times a fused paged kernel's traffic). Steps are the device's time with Python's launches
hidden, as CUDA graphs hide vLLM's (docs/stub.md, "Timing"). It has not run on a GPU yet (no
device was lent to the sessions so far), so no such error is stated here. Where it has run, its
results are in `bench/results/gpu/<gpu>/` and this section gives them.

## Interpolation choices

Measured against the same held-out points (previous protocol: every other batch size and
context, the token counts between powers of two; 33 of 100 pairs above 10 % with the tables as
shipped then, worst 22 %), the alternatives to piecewise linear in the value all did worse, so
the tables stay as they are: interpolating the 2-D attention tables linearly in log batch and
log context: 100 pairs above 10 % (worst 64 %); in log batch only or log context only: 100 (36 %);
the 1-D tables in log tokens: 48 (25 %); decode attention by batch x KV tokens summed over the
rows (which lines the L2 jump below up with an axis, but extrapolates the small batches past
their longest context): 45 (29 %); the GEMM table as time per token: its held-out error above
10 % in 96 pairs instead of 41; filling the cells the source ran out of memory for from the
nearer of the row and the column: 37. Attention is close to affine in batch and in context
(a fixed cost plus the KV bytes read), which linear interpolation in the value reproduces
exactly and a log axis bends. On the current protocol below, the cells the source ran out of
memory for were first filled by scaling the nearest smaller batch in proportion, which scales the
fixed cost too: 93 of 173 pairs above 10 % (H100 TP8 Qwen3-32B with an fp8 KV cache 11.1 %: a
filled batch-256 cell at 8k context put the held-out batch 128 at 136 us per layer, measured
113); taking the measured cell with the same KV tokens (batch x context) at a smaller batch: 89
(it misses the per-row cost at large batches); the column's last segment extended, never
steeper than in proportion (shipped): 85, with 34 pairs' worst point better (24 of them on
H100 and H200, none there worse) and 6 worse: A100 TP4 Llama-3.1-8B and Mistral-7B (14.7 ->
16.9 %: their decode attention grows faster than the batch from 64 to 128 rows at 8k context,
351 -> 866 us per layer, which no rule from smaller batches sees) and L40S TP2 (10.3 -> 10.9 %).

## Validation on held-out points

"""


def write_doc(results: dict, examples: dict, src: Source, path: Path) -> None:
    lines = [HEADER.format(source=f"{src.package} {src.version}", licence=src.licence).rstrip(),
        "",
        "Reference step = the sum of the measured kernels of one vLLM step at that point plus "
        "the unmeasured elementwise term (the same in both); no CPU overhead in either. Model = "
        "kvcap's measured step model given tables WITHOUT the held-out knots. The held-out knots "
        "are systematic, the same rule on every axis of every table: of the values the source "
        "measured on that axis, in order, the second of every three (index 1, 4, 7, ...; never "
        "the last, so every held-out value lies between two kept ones and nothing is "
        "extrapolated); GEMM token counts m and m + 1 (the two sides of a tile boundary, measured "
        "from 32 up on most systems) count as one value. "
        + "For Llama-3.1-8B at TP2 (other models and TPs: the same rule on their own grids) on "
        + "; ".join(", ".join(systems) + ": " + ", ".join(
            f"{axis} {list(vals)}" for axis, vals in held if vals)
            for held, systems in examples.items()) + ". "
        "A point is held out when any of its lookups falls on a held-out knot (decode: batch x "
        "context, and the batch as token count; prefill: batch x prompt length and their product; "
        "mixed: one prompt with decodes; an all-reduce message between the neighbours of a "
        "held-out message size); the shipped profiles keep all knots, whose spans are half as "
        "long. Prefill on top of cached context is not validated (the source measures prefills "
        "from an empty cache only). The last columns are kvcap's analytic roofline (the default "
        "before profiles, with its 3 ms overhead) at the same points.", "",
        "| GPU | model | TP | KV cache | vLLM | points | median error | worst error | worst point "
        "| roofline median | roofline worst |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (gpu, model, tp, kv, ver), rows in results.items():
        med, worst, errs = _pct(rows, 3)
        omed, oworst, _ = _pct(rows, 4)
        w = max(range(len(rows)), key=lambda i: errs[i])
        lines.append(f"| {gpu} | {model} | {tp} | {kv} | {ver} | {len(rows)} | {med:.1f} % | "
                     f"{worst:.1f} % | {rows[w][0]}: {rows[w][1]} | {omed:.0f} % | {oworst:.0f} % |")
    lines += ["", "By step kind, all pairs together:", "",
              "| kind | points | median error | worst error |", "|---|---|---|---|"]
    for kind in ("decode", "prefill", "mixed"):
        rows = [r for rs in results.values() for r in rs if r[0] == kind]
        if rows:
            med, worst, _ = _pct(rows, 3)
            lines.append(f"| {kind} | {len(rows)} | {med:.1f} % | {worst:.1f} % |")
    over = sorted(f"{g} {m} tp{t}" + ("" if kv == "bf16" else f" {kv} KV")
                  for (g, m, t, kv, _), rs in results.items() if _pct(rs, 3)[1] > 10)
    lines += ["", f"Pairs above 10 % at their worst held-out point ({len(over)} of "
              f"{len(results)}): " + (", ".join(over) if over else "none") + ".", "",
              "At those worst points the measured time between the two kept neighbouring knots is "
              "far from linear, and from the kept knots alone no interpolation can know it (see "
              "\"Interpolation choices\" above): GEMM time steps with the kernels' tile "
              "quantization and cuBLAS's choice of kernel per shape (A100 measures m = 96, 128, "
              "160: at 128 the GEMMs take 14 % less than the line from 96 to 160), the "
              "custom all-reduce switches algorithm at a message size (L40S: 0.58 ms at 512 KiB, "
              "2.08 ms at 1 MiB), and decode attention jumps where one layer's summed KV outgrows "
              "the L2 cache (L40S, Qwen3-32B TP2, batch 1: 0.042 ms per layer at 32k tokens of "
              "context, 64 MiB of KV, and 0.236 ms at 64k, 128 MiB, against a 96 MiB L2; B200 "
              "between 64 and 128 MiB). That last one is also a caveat on the source itself: its "
              "microbenchmark reads one layer's KV again and again, which stays in L2 below the "
              "jump, while a real forward pass reads every layer's own KV once per step, so below "
              "the jump the measured decode attention on those GPUs is optimistic.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, required=True, help="aiconfigurator-core wheel")
    ap.add_argument("--out", type=Path, default=PROFILE_DIR)
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "timing.md")
    a = ap.parse_args()
    src = open_wheel(a.wheel)
    a.out.mkdir(parents=True, exist_ok=True)
    results, examples = {}, {}
    for gpu, model, tp, kv, k in covered(src):
        if model.name == "llama-3.1-8b" and tp == 2 and kv == "auto":
            h = held_out(k)
            held = (("decode batch sizes", h.decode_batch), ("contexts", h.context),
                    ("prefill batch sizes", h.prefill_batch), ("prompt lengths", h.prompt),
                    ("token counts", h.tokens),
                    ("all-reduce messages (tokens)", {_sig(x) for x in h.allreduce_tokens}))
            systems = examples.setdefault(tuple((a, tuple(sorted(v))) for a, v in held), [])
            systems += [] if k.system in systems else [k.system]
        prof = build(k, src, gpu, model, tp, hold=False)
        parse_tables(prof, prof["name"])          # what kvcap will accept
        (a.out / f"{prof['name']}.json").write_text(json.dumps(prof, separators=(',', ':')) + "\n")
        rows = validate(k, build(k, src, gpu, model, tp, hold=True),
                        _roofline(gpu, model, tp, kv))
        results[(gpu, model.name, tp, KV_DTYPES[kv].replace("bfloat16", "bf16"),
                 k.vllm_version)] = rows
        med, worst, _ = _pct(rows, 3)
        print(f"{prof['name']}: {len(rows)} held-out points, median {med:.1f} %, "
              f"worst {worst:.1f} %")
    write_doc(results, examples, src, a.doc)


if __name__ == "__main__":
    main()
