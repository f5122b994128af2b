"""The torch stub executor (`--executor stub`): every step plan executed on real tensors.

Owns the executor (`executor`: `StubExecutor`, integrity checks, timing), the paged KV storage and
its copies (`kv`) and the weightless model (`model`). The only part of replay/ besides
`replay.calibration` that imports torch; on top of the engine's step contract and the timing's cost
model. Runs with nothing but torch and numpy installed: must not import polars, duckdb,
traces/ or capacity/ (import-linter contracts in pyproject.toml).
"""
