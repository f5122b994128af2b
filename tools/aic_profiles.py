"""Make kvcap's shipped step-time profiles and docs/timing.md from NVIDIA AIConfigurator's data.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python tools/aic_profiles.py --wheel /tmp/aic/aiconfigurator_core-0.12.0-*.whl

writes replay/profiles/<gpu>--<model>--bf16--tp<N>.json for every catalog GPU x model x TP the
database covers (the model fits the GPUs, its head counts per GPU were measured), and
docs/timing.md: the step-time error of kvcap's measured model (replay/step_profile.py, the Python
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from aic_source import SYSTEMS, Kernels, Source, fill_grid, open_wheel  # noqa: E402
from replay import catalog  # noqa: E402
from replay.step_profile import (FORMAT, MAX_COLS_2D, MAX_KNOTS_1D, MAX_ROWS_2D,  # noqa: E402
                                 PROFILE_DIR, parse_tables, profile_name, step_aggregates)

TPS = (1, 2, 4, 8)
# Knots of the shipped 1-D tables: every GEMM m the database measures (1..17, then pairs m, m + 1
# either side of the kernels' tile boundaries: time jumps there, which no interpolation guesses).
TOKEN_KNOTS = (list(range(1, 18)) + [m + d for m in (32, 48, 64, 80, 96, 112, 128, 160, 192, 224)
                                     for d in (0, 1)]
               + [m + d for m in range(256, 4353, 256) for d in (0, 1)] + [8192, 16384, 32768])
# Held out of the validation's tables (docs/timing.md): token counts between boundaries.
HELD_TOKENS = ({3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15}
               | {m + d for m in (48, 80, 96, 112, 160, 192, 224, 768, 1280, 1536, 1792, 2304,
                                  2560, 2816, 3072, 3328, 3584, 3840) for d in (0, 1)})
HELD_BATCH = {2, 8, 32, 128, 512}
HELD_PREFILL_LEN = {32, 128, 512, 1536, 3072, 6144, 12288}
HELD_CONTEXT = {4, 16, 64, 256, 1024, 4096, 16384, 65536}


def _sig(x: float) -> float:
    return float(f"{x:.5g}")


def _measured(k: Kernels, tokens: int) -> bool:
    """Every GEMM of the step measured at this m (some systems lack a few shapes)."""
    try:
        k.linear_s(tokens), k.lm_head_s(tokens)
        return True
    except KeyError:
        return False


def build(k: Kernels, src: Source, gpu: str, model, tp: int, *, hold: bool) -> dict:
    """One profile as a JSON object (`hold`: without the validation's held-out knots)."""
    tokens = [t for t in TOKEN_KNOTS
              if _measured(k, t) and not (hold and t in HELD_TOKENS)]
    assert len(tokens) <= MAX_KNOTS_1D

    def grid(cells, held_rows, held_cols):
        rows = sorted({b for b, _ in cells if not (hold and b in held_rows)})
        cols = sorted({x for _, x in cells if not (hold and x in held_cols)})
        rows, cols = rows[:MAX_ROWS_2D], cols[-MAX_COLS_2D:]
        g, filled = fill_grid(cells, rows, cols)
        return {"rows": rows, "cols": cols,
                "s": [[_sig(model.num_layers * t / 1e3) for t in line] for line in g]}, filled

    pre, pre_filled = grid(k.context, HELD_BATCH, HELD_PREFILL_LEN)
    dec, dec_filled = grid(k.generation, HELD_BATCH, HELD_CONTEXT)
    tables = {
        "linear_s": {"x": tokens, "s": [_sig(k.linear_s(t)) for t in tokens]},
        "lm_head_s": {"x": tokens, "s": [_sig(k.lm_head_s(t)) for t in tokens]},
        "prefill_attention_s": pre,
        "decode_attention_s": dec,
    }
    if tp > 1:
        tables["allreduce_s"] = {"x": tokens, "s": [_sig(k.allreduce_s(t)) for t in tokens]}
    name = profile_name(gpu, model.name, "bf16", tp)
    return {
        "format": FORMAT, "name": name, "gpu": gpu, "model": model.name, "dtype": "bf16",
        "kv_cache_dtype": "auto", "tensor_parallel_size": tp,
        "source": {
            "name": "NVIDIA AIConfigurator perf database", "package": src.package,
            "version": src.version, "licence": src.licence,
            "url": "https://github.com/ai-dynamo/aiconfigurator",
            "system": k.system, "framework": "vllm", "framework_version": k.vllm_version,
            "attention_kernels": k.attention_kernel,
            "not_measured": "elementwise kernels (bytes / 0.8 HBM, AIConfigurator's rule) in "
                            "linear_s; GEMM widths between measured n/k interpolated linearly; "
                            f"{pre_filled} prefill and {dec_filled} decode attention cells the "
                            "source lacks, scaled from the nearest smaller measured batch; no "
                            "CPU-side step overhead (overhead_s = 0: calibrate it)",
        },
        "constants": {"overhead_s": 0.0, "overhead_per_row_s": 0.0, "kernel_scale": 1.0},
        "tables": tables,
    }


def covered(src: Source):
    """(gpu, model, tp, Kernels) for every combination the database measures."""
    for gpu in SYSTEMS:
        g = catalog.get_gpu(gpu)
        for model in catalog._MODELS:
            for tp in TPS:
                if model.weight_bytes / tp > 0.8 * g.memory_bytes:
                    continue
                try:
                    k = Kernels(src, gpu, model, tp, g.hbm_bandwidth_bytes_per_s)
                    yield gpu, model, tp, k
                except (LookupError, KeyError) as exc:
                    print(f"skip {gpu} {model.name} tp{tp}: {exc}", file=sys.stderr)


# ------------------------------------------------------------------ validation
def heldout_points(k: Kernels):
    """(kind, description, new tokens per row, computed per row, reference seconds): steps
    composed from measured kernels only, each at a point held out of the validation tables."""
    m_ok = {m for m in k.gemm_m if _measured(k, m)}

    def step(new, ctx, t_attn):
        t = sum(new)
        return k.linear_s(t) + k.lm_head_s(len(new)) + k.allreduce_s(t) + t_attn

    for (b, c), _ in sorted(k.generation.items()):
        if (b in HELD_BATCH or c in HELD_CONTEXT) and b in m_ok:
            yield ("decode", f"batch {b} x context {c}", [1] * b, [c - 1] * b,
                   step([1] * b, None, k.decode_attention_s(b, c)))
    for (b, n), _ in sorted(k.context.items()):
        if (b in HELD_BATCH or n in HELD_PREFILL_LEN or b * n in HELD_TOKENS) and b * n in m_ok:
            yield ("prefill", f"{b} x {n}-token prompts", [n] * b, [0] * b,
                   step([n] * b, None, k.prefill_attention_s(b, n)))
    for n in (256, 512, 1024, 2048, 4096):
        for b in (1, 16, 256, 512):
            for c in sorted({x for (bb, x) in k.generation if bb == b}):
                if n + b not in m_ok or b + 1 not in m_ok or (1, n) not in k.context or c not in HELD_CONTEXT:
                    continue
                yield ("mixed", f"{n}-token prompt + {b} decodes at context {c}",
                       [n] + [1] * b, [0] + [c - 1] * b,
                       step([n] + [1] * b, None, k.prefill_attention_s(1, n)
                            + k.decode_attention_s(b, c)))


def _roofline(gpu: str, model, tp: int):
    """kvcap's analytic cost model with catalog constants (the default before profiles)."""
    from replay import memory
    from replay.cost_model import CostModel
    from replay.executors import catalog_constants, model_shape
    return CostModel(shape=model_shape(model), constants=catalog_constants(catalog.get_gpu(gpu)),
                     tp=tp, kv_bytes_per_token=memory.kv_bytes_per_token(model, tp, "auto"),
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

With a measured profile (the default wherever one ships: replay/profiles/, chosen by GPU x
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
extended), with no logarithms so that the compiled core (replay/kvcore.h `cost_measured_s`) and
the Python reference (replay/step_profile.py `MeasuredTables.step_s`) agree bit for bit. Where
no profile ships (other GPUs, models whose per-GPU head counts the source did not measure, an
fp8 KV cache) the analytic roofline of docs/cost-model.md prices the step, with a one-line
warning on stderr.

The tables come from {source}: NVIDIA AIConfigurator's database of vLLM kernels measured on each
GPU ({licence}). Per layer: the QKV, output, gate/up and down GEMMs (bf16) at the step's token
count, FlashAttention for prefill (batch x prompt length) and decode (batch x context), two
custom all-reduces under TP; the lm_head GEMM once for the sampling rows. Not measured there, and
said in each profile's `source.not_measured`: the bandwidth-bound elementwise kernels (norms,
activation, embedding: AIConfigurator's bytes / 0.8 HBM rule, folded into `linear`), GEMM widths
between measured n/k (linear in n and k, as AIConfigurator does), attention cells the source ran
out of memory for (scaled from the nearest smaller batch), and the CPU-side step overhead
(`overhead_s` = 0 in the shipped profiles: vLLM's V1 engine overlaps most of it; fit it with
`kvcap calibrate --from-bench` below).

## What changes against the roofline

The measured kernels run one after another, as they do in vLLM; the roofline took the larger of
compute and memory time for the whole step (as if the GEMMs overlapped the KV reads) and added
3 ms. On an H100 with Llama-3.1-8B, steps at small and medium batch get cheaper (decode batch 1 at
2,048 context: 9.1 -> 5.9 ms; a 2,048-token prefill: 53 -> 43 ms, the GEMMs reach about 720 of the
989 dense TFLOP/s), while KV-heavy mixed steps cost more (1,153 tokens with 336 decodes at 1.4k
context: 31 -> 44 ms: 19 ms of it reading 60 GB of KV). A trace that fills the KV cache therefore
saturates somewhat earlier than the roofline said (the built-in flash-crowd scenario at twice its
rate: 23.6 instead of 24.8 req/s served).

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

## Validation on held-out points

"""


def write_doc(results: dict, src: Source, path: Path) -> None:
    lines = [HEADER.format(source=f"{src.package} {src.version}", licence=src.licence).rstrip(),
        "",
        "Reference step = the sum of the measured kernels of one vLLM step at that point plus "
        "the unmeasured elementwise term (the same in both); no CPU overhead in either. Model = "
        "kvcap's measured step model given tables WITHOUT the held-out knots: batch sizes "
        f"{sorted(HELD_BATCH)}, contexts {sorted(HELD_CONTEXT)}, prompt lengths "
        f"{sorted(HELD_PREFILL_LEN)}, token counts {sorted(HELD_TOKENS)}. Every point below is at "
        "such a held-out value (decode: batch x context; prefill: batch x prompt length; mixed: "
        "one prompt with decodes at held-out contexts); the shipped profiles keep all knots. "
        "Prefill on top of cached context is not validated (the source measures prefills from "
        "an empty cache only). The last columns are kvcap's analytic roofline (the default "
        "before profiles, with its 3 ms overhead) at the same points.", "",
        "| GPU | model | TP | vLLM | points | median error | worst error | worst point "
        "| roofline median | roofline worst |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for (gpu, model, tp, ver), rows in results.items():
        med, worst, errs = _pct(rows, 3)
        omed, oworst, _ = _pct(rows, 4)
        w = max(range(len(rows)), key=lambda i: errs[i])
        lines.append(f"| {gpu} | {model} | {tp} | {ver} | {len(rows)} | {med:.1f} % | "
                     f"{worst:.1f} % | {rows[w][0]}: {rows[w][1]} | {omed:.0f} % | {oworst:.0f} % |")
    lines += ["", "By step kind, all pairs together:", "",
              "| kind | points | median error | worst error |", "|---|---|---|---|"]
    for kind in ("decode", "prefill", "mixed"):
        rows = [r for rs in results.values() for r in rs if r[0] == kind]
        if rows:
            med, worst, _ = _pct(rows, 3)
            lines.append(f"| {kind} | {len(rows)} | {med:.1f} % | {worst:.1f} % |")
    over = sorted(f"{g} {m} tp{t}" for (g, m, t, _), rs in results.items() if _pct(rs, 3)[1] > 10)
    lines += ["", f"Pairs above 10 % at their worst held-out point ({len(over)} of "
              f"{len(results)}): " + (", ".join(over) if over else "none") + ". At their "
              "worst points (table above) the measured time between the two kept neighbouring "
              "knots is far from linear (kernel tile and split heuristics change there), which "
              "no interpolation between those knots can know.",
              ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, required=True, help="aiconfigurator-core wheel")
    ap.add_argument("--out", type=Path, default=PROFILE_DIR)
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "timing.md")
    a = ap.parse_args()
    src = open_wheel(a.wheel)
    a.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for gpu, model, tp, k in covered(src):
        prof = build(k, src, gpu, model, tp, hold=False)
        parse_tables(prof, prof["name"])          # what kvcap will accept
        (a.out / f"{prof['name']}.json").write_text(json.dumps(prof, separators=(',', ':')) + "\n")
        rows = validate(k, build(k, src, gpu, model, tp, hold=True), _roofline(gpu, model, tp))
        results[(gpu, model.name, tp, k.vllm_version)] = rows
        med, worst, _ = _pct(rows, 3)
        print(f"{prof['name']}: {len(rows)} held-out points, median {med:.1f} %, "
              f"worst {worst:.1f} %")
    write_doc(results, src, a.doc)


if __name__ == "__main__":
    main()
