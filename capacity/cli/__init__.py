"""The `kvcap` command line (DESIGN §7).

Every command takes `--json` and then prints exactly one JSON object on stdout; progress and logs go
to stderr. Bad input exits non-zero with a one-line reason.

Commands are registered lazily: a command's module (and what it imports: the analyses, the
report, torch for calibrate) is loaded when that command runs or when `--help` lists it, so
`kvcap replay` does not pay for sixteen other commands (about 0.1 s of interpreter time, and
typer's conversion of each command's parameters).
"""
from __future__ import annotations

import importlib
import os
from collections.abc import MutableMapping

import typer
from typer.core import TyperGroup

try:                        # typer >= 0.2x carries its own click
    from typer._click.exceptions import ClickException
except ImportError:         # a typer on the click package
    from click.exceptions import ClickException

from capacity.cli import helpfmt, values

# name -> (module, attribute): a command function or, for `trace`, a sub-app. The order is the
# order `kvcap --help` lists them in (typer lists commands before sub-apps).
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("capacity.cli.replay", "replay_cmd"),
    "runs": ("capacity.cli.replay", "runs_cmd"),
    "export": ("capacity.cli.runs", "export_cmd"),
    "calibrate": ("capacity.cli.calibrate", "calibrate_cmd"),
    "size-swap": ("capacity.cli.plan", "size_swap_cmd"),
    "size-offload": ("capacity.cli.offload", "size_offload_cmd"),
    "compare-modes": ("capacity.cli.plan", "compare_modes_cmd"),
    "report": ("capacity.cli.plan", "report_cmd"),
    "logs": ("capacity.cli.evidence", "logs_cmd"),
    "attribute": ("capacity.cli.evidence", "attribute_cmd"),
    "validate": ("capacity.cli.evidence", "validate_cmd"),
    "tune": ("capacity.cli.tune", "tune_cmd"),
    "headroom": ("capacity.cli.tune", "headroom_cmd"),
    "alerts": ("capacity.cli.tune", "alerts_cmd"),
    "fleet": ("capacity.cli.fleet", "fleet_cmd"),
    "plan": ("capacity.cli.fleet", "plan_cmd"),
    "sweep": ("capacity.cli.sweep", "sweep_cmd"),
    "trace": ("capacity.cli.trace", "app"),
}
# Registered on `app` itself (typer needs two commands to make a group): the module `replay`
# needs anyway.
EAGER = ("replay", "runs")


def command_object(name: str):
    """The command function (or sub-app) registered as `name`."""
    module, attr = COMMANDS[name]
    return getattr(importlib.import_module(module), attr)


def click_command(name: str):
    """Command `name` converted by typer exactly as if it had been registered on `app`: through
    a one-command app of the same settings (typer's public conversion, no private helpers)."""
    obj = command_object(name)
    one = typer.Typer(add_completion=False, rich_markup_mode=None)
    if isinstance(obj, typer.Typer):
        one.add_typer(obj, name=name)
        return typer.main.get_command(one).commands[name]
    one.command(name)(obj)
    return typer.main.get_command(one)


class LazyCommands(MutableMapping):
    """A group's commands by name: every name of COMMANDS is a key, and its click command is
    made on first lookup (run, `--help`, "did you mean" matches names only)."""

    def __init__(self, loaded) -> None:
        self.loaded = dict(loaded)
        for cmd in self.loaded.values():
            values.install(cmd)
            helpfmt.install(cmd)

    def __getitem__(self, name: str):
        if name not in self.loaded and name in COMMANDS:
            self.loaded[name] = cmd = click_command(name)
            values.install(cmd)
            helpfmt.install(cmd)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd) -> None:
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self.loaded[name]

    def __iter__(self):
        return iter([*COMMANDS, *(n for n in self.loaded if n not in COMMANDS)])

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self.loaded.keys())


class LazyGroup(TyperGroup):
    """The `kvcap` group: lists every command, converts one only when it is looked up."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.commands = LazyCommands(self.commands)
        values.install(self)
        self.context_class = helpfmt.Context

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)      # names only (typer's own walks the values)


# Plain (click) help, not typer's rich panels: those cut flag names to fit 80 columns
# (`--num-gpu-blocks-o…`); click's puts a long name on a line of its own and never cuts it.
# `-h` everywhere: subcommands inherit the group's help option names.
HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(cls=LazyGroup, no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None, context_settings=HELP,
                  help="Replay LLM request traces through a paged-KV engine model and plan KV capacity.")
for _name in EAGER:
    app.command(_name)(command_object(_name))


def version() -> str:
    """kvcap's version: the installed package's, else the one replays record (a source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed("kvcap")
    except PackageNotFoundError:
        from replay.run import KVCAP_VERSION
        return KVCAP_VERSION


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvcap {version()}")
        raise typer.Exit()


@app.callback()
def _main_options(_version: bool = typer.Option(False, "--version", is_eager=True,
                                                 callback=_print_version,
                                                 help="Print kvcap's version and exit.")) -> None:
    """Replay LLM request traces through a paged-KV engine model and plan KV capacity."""


def main() -> None:
    # numpy's OpenBLAS otherwise starts a worker thread per core that spins for a while once
    # numpy is loaded: ~0.1 s of CPU per `kvcap replay`, taken from the replay and the DuckDB
    # writer on a small machine, for BLAS calls kvcap does not make (its fits are tiny).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        # prog_name: `kvcap`, however it was started (`python -m capacity.cli`, a test)
        code = app(standalone_mode=False, prog_name="kvcap")
    except ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":     # bare `kvcap` / `kvcap trace`: the help
            e.show()
        else:
            typer.echo(usage_error_line(e), err=True)
        raise SystemExit(e.exit_code) from None
    except typer.Abort:
        typer.echo("kvcap: aborted", err=True)
        raise SystemExit(1) from None
    # Not standalone: an Exit's code comes back as the value (a command itself returns None).
    raise SystemExit(code if isinstance(code, int) else 0)


def usage_error_line(e) -> str:
    """click's usage error (unknown option, bad value, missing argument) as one line naming the
    command's help, instead of click's three (usage, hint, error)."""
    from traces.schema import printable
    message = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    # click's parser raises some (an option without its value) before a context exists.
    path = ctx.command_path if ctx is not None else _command_path()
    return f"kvcap: error: {printable(message)} (see `{path} -h`)"


def _command_path(argv: list[str] | None = None) -> str:
    """`kvcap COMMAND [SUBCOMMAND]` of a command line (sys.argv by default)."""
    import sys
    args = list(sys.argv[1:] if argv is None else argv)
    path = ["kvcap"]
    if args and args[0] in COMMANDS:
        path.append(args[0])
        subs = getattr(click_command(args[0]), "commands", None) if args[0] == "trace" else None
        if subs and len(args) > 1 and args[1] in subs:
            path.append(args[1])
    return " ".join(path)


def console() -> None:
    """The `kvcap` executable: `main()` in a process that ends as soon as the command has.

    A short-lived process: import-time garbage collections re-scan the ~500k objects of the
    loaded modules for nothing (a larger first-generation threshold: fewer of them), and the
    interpreter's teardown frees a replay's hundreds of MB object by object (about 0.07 s of
    CPU for Azure conv), which the exit does at once. Exit handlers (spill folders, worker
    pools, logging) still run; with a non-daemon thread still alive, the exit is Python's own."""
    import atexit
    import gc
    import os
    import sys
    import threading
    gc.set_threshold(50_000, 20, 20)
    # jsonschema (under altair) imports rfc3987_syntax when it is installed (JupyterLab's
    # jsonschema[format-nongpl] brings it), which builds 38 lark grammars at import: 2.5 of
    # altair's 3 s. No kvcap command validates URI formats, so the command line goes without
    # (jsonschema then skips that format checker). Notebooks keep the user's modules untouched.
    sys.modules.setdefault("rfc3987_syntax", None)
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if others or not (code is None or isinstance(code, int)):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):       # a closed pipe: what Python's own exit reports
        code = code or 120
    os._exit(code or 0)


if __name__ == "__main__":
    main()
