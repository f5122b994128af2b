"""What a replay yields and where it is kept: the result tables and the DuckDB store (DESIGN §6).

Owns turning a `RawRun` into tables (`tables`: `RunResult`, `build_tables`), summary replays that
keep reductions instead of columns (`summary`, with the exact quantiles of `quantiles`), the DuckDB
store (`store`, the only module of replay/ that imports duckdb), the checks of a --db file made
before DuckDB loads (`dbfile`) and `kvcap replay`'s writer thread (`writer`).

Reads the engine's leaf records only (`replay.engine.raw`, `replay.engine.state`); never the
schedulers, the loop, the compiled cores, timing, the stub or fleets (import-linter contracts in
pyproject.toml).
"""
