"""The engine model: replay a trace through vLLM's schedulers and price every step.

`replay.run.replay(trace, config)` is the one call; `replay.config.EngineConfig` what users set.
Its parts, each a folder (docs/design.md, "replay/'s parts"; import-linter contracts in
pyproject.toml keep the direction): `fleet`, `calibration` -> `run` -> `config`, `stub`,
`results` -> `engine` (schedulers, block pools, step contract, loop, compiled cores) -> `timing`
(catalog, KV memory, cost model, step profiles).
"""
