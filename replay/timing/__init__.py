"""Step times and the numbers they are made of.

Owns the model and GPU catalog (`catalog`), the KV memory formulas (`memory`: bytes per token and
block, block counts), measured step-time profiles (`step_profile`, the shipped `profiles/*.json`),
the analytic cost model executor (`cost_model`) and building it from a resolved engine
(`executors`). The fits that make profiles from measurements live in `replay.calibration`.

Plain Python and numpy: the bottom of replay/, it imports nothing else from it (the cost model
names the engine's `StepPlan` in annotations only). Must not import traces/, capacity/, polars,
duckdb or torch (import-linter contracts in pyproject.toml).
"""
