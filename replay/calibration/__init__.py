"""`kvcap calibrate`: the fits that turn measurements into a step-time profile (docs/timing.md).

Three sources, one module each: the torch stub timed on a device (`stub_fit`), a `vllm bench serve`
result (`bench_fit`) and a vLLM server log of a known trace (`log_fit`). On top of the replay
(`replay.run`), the stub and timing's cost model; nothing in replay/ imports it (import-linter
contracts in pyproject.toml).
"""
