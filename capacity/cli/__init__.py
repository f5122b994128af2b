"""The `kvcap` command line (DESIGN §7).

Every command takes `--json` and then prints exactly one JSON object on stdout; progress and logs go
to stderr. Bad input exits non-zero with a one-line reason.
"""
from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Replay LLM request traces through a paged-KV engine model and plan KV capacity.")


def _register() -> None:
    # Imported here, after `app` exists, so each command module stays importable on its own.
    from capacity.cli import calibrate, evidence, fleet, offload, plan, replay, trace, tune
    app.add_typer(trace.app, name="trace")
    app.command("replay")(replay.replay_cmd)
    app.command("runs")(replay.runs_cmd)
    app.command("calibrate")(calibrate.calibrate_cmd)
    app.command("size-swap")(plan.size_swap_cmd)
    app.command("size-offload")(offload.size_offload_cmd)
    app.command("compare-modes")(plan.compare_modes_cmd)
    app.command("report")(plan.report_cmd)
    app.command("logs")(evidence.logs_cmd)
    app.command("attribute")(evidence.attribute_cmd)
    app.command("validate")(evidence.validate_cmd)
    app.command("tune")(tune.tune_cmd)
    app.command("headroom")(tune.headroom_cmd)
    app.command("alerts")(tune.alerts_cmd)
    app.command("fleet")(fleet.fleet_cmd)
    app.command("plan")(fleet.plan_cmd)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
