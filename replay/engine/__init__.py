"""The engine model: what vLLM's engine core decides, step by step, and nothing about time.

Owns the per-request state (`state`), the resolved scheduler spec (`spec`), block keys (`prefix`),
the step contract between a scheduler and an executor (`plan`), what a replay produces before it
becomes tables (`raw`), the schedulers and their block pools (`v0/`, `v1/`: the Python reference),
the reference loop (`loop`), the compiled cores (`v0/_core.c`, `v1/_core.c`, their shared
`kvcore.h`) and their one Python adapter (`compiled`), and where two replays first differ
(`divergence`).

Numpy only. Imports from the rest of replay/ only `replay.timing` (the compiled adapter hands the
cost model's constants to the cores, whose C prices each step); never config, run, results, stub,
fleet or calibration (import-linter contracts in pyproject.toml).
"""
