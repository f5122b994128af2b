"""The `kvcap` command line (DESIGN §7).

Every command takes `--json` and then prints exactly one JSON object on stdout; progress and logs go
to stderr. Bad input exits non-zero with a one-line reason.
"""
from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Replay LLM request traces through a paged-KV engine model and plan KV capacity.")


def _register() -> None:
    from capacity import cli_trace
    from capacity import cli_replay
    from capacity import cli_calibrate
    app.add_typer(cli_trace.app, name="trace")
    app.command("replay")(cli_replay.replay_cmd)
    app.command("runs")(cli_replay.runs_cmd)
    app.command("calibrate")(cli_calibrate.calibrate_cmd)
    from capacity import cli_capacity
    app.command("size-swap")(cli_capacity.size_swap_cmd)
    app.command("compare-modes")(cli_capacity.compare_modes_cmd)
    app.command("report")(cli_capacity.report_cmd)
    from capacity import cli_evidence
    app.command("logs")(cli_evidence.logs_cmd)
    app.command("attribute")(cli_evidence.attribute_cmd)
    app.command("validate")(cli_evidence.validate_cmd)
    from capacity import cli_tune
    app.command("tune")(cli_tune.tune_cmd)
    app.command("headroom")(cli_tune.headroom_cmd)
    app.command("alerts")(cli_tune.alerts_cmd)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
