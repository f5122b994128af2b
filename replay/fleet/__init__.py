"""Fleet replay: N identical replicas of one engine behind a router (issue 19, docs/fleet.md).

Owns the replay of a fleet (`run`: `replay_fleet`, `FleetResult`, the `lor` router that reads
replica state) and the routers that need none (`routing`: `rr`, `prefix`). On top of
`replay.run` and the engine's compiled adapter; nothing in replay/ imports it (import-linter
contracts in pyproject.toml).
"""
