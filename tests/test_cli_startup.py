"""What `kvcap` loads to run one command: commands registered lazily (all still listed), no
pydantic for plain flag values (and typer's answers, errors included, for every value), no
analyses, report, charts or rich for `kvcap replay --json`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from capacity.cli import COMMANDS, app, values

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def test_help_lists_every_command_and_each_one_runs_its_help():
    top = runner.invoke(app, ["--help"], terminal_width=200)
    assert top.exit_code == 0, top.output
    for name in COMMANDS:
        assert f" {name} " in top.output, name
        sub = runner.invoke(app, [name, "--help"], terminal_width=200)
        assert sub.exit_code == 0, (name, sub.output)
        assert "Usage:" in sub.output


def test_a_mistyped_command_is_matched_against_all_commands():
    res = runner.invoke(app, ["repla"], terminal_width=200)
    assert res.exit_code == 2
    assert "Did you mean 'replay', 'plan'?" in res.output


def test_replay_json_loads_only_what_it_needs(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    code = ("import sys\nfrom capacity.cli import main\n"
            f"sys.argv = ['kvcap', 'replay', {str(trace)!r}, '--db', {str(tmp_path / 'k.duckdb')!r},"
            " '--json', '--max-num-seqs', '8', '--rate-scale', '1.5']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(sys.modules), file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         check=True)
    assert json.loads(res.stdout.splitlines()[0])["requests_finished"] == 2
    loaded = set(eval(res.stderr.strip().splitlines()[-1]))
    other_commands = {m for m, _ in COMMANDS.values()} - {"capacity.cli.replay"}
    assert not loaded & other_commands
    for heavy in ("pydantic", "rich", "altair", "torch", "pyarrow", "capacity.report",
                  "capacity.views", "replay.stub"):
        assert heavy not in loaded, heavy


def _command(annotation):
    """A one-parameter typer command of that type and its parameter (typer's conversion)."""
    def cmd(x=typer.Option(None, "--x")) -> None:   # noqa: B008
        pass
    cmd.__annotations__ = {"x": annotation, "return": None}
    one = typer.Typer(add_completion=False)
    one.command()(cmd)
    click_cmd = typer.main.get_command(one)
    return click_cmd, next(p for p in click_cmd.params if p.name == "x")


CASES = {
    str: ["abc", "", " 1 ", "-", "ü"],
    int: ["12", "-3", "0", "007", "+4", " 5", "1_000", "1e3", "abc", "", "3.0", 7, 2.5,
          "123456789012345678", "12345678901234567890"],
    float: ["1.5", "-0", "2", "1e-3", ".5", "inf", "nan", "1,5", "", "abc", " 2.5", 3, 4.25,
            "0.1000000000000000055511151231257827"],
    bool: [True, False, "true", "no", "x"],
    Path: ["a/b.csv", "", "-", "/", Path("x")],
}


@pytest.mark.parametrize("annotation", list(CASES), ids=lambda a: a.__name__)
def test_plain_values_are_what_typer_makes_of_them(annotation):
    """Every value, valid or not: the same result (type included) or the same error."""
    from typer._coercion import build_runtime_param
    click_cmd, param = _command(annotation)
    assert values._plain_parameter(param) or param._runtime_param is not None
    ctx = click_cmd.make_context("cmd", [], resilient_parsing=True)
    full = build_runtime_param(param.type_descriptor)
    for value in CASES[annotation]:
        def outcome(conv):
            try:
                out = conv.coerce(value, param=param, ctx=ctx)
                return ("ok", type(out), repr(out))
            except Exception as e:  # noqa: BLE001 - the error itself is compared
                return ("error", type(e), str(e))
        assert outcome(values.PlainValues()) == outcome(full), value


def test_install_gives_plain_parameters_the_fast_converter():
    click_cmd = typer.main.get_command(app).commands["replay"]
    kinds = {p.name: type(p._runtime_param).__name__ for p in click_cmd.params}
    assert kinds["max_num_seqs"] == kinds["db"] == kinds["rate_scale"] == "PlainValues"


def _console(*argv: str, cwd: Path = REPO):
    code = f"import sys\nfrom capacity.cli import console\nsys.argv = ['kvcap', *{list(argv)!r}]\nconsole()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)


def test_the_executable_exits_with_the_commands_code_output_flushed(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,3\n1,6,2\n")
    ok = _console("replay", str(trace), "--db", str(tmp_path / "k.duckdb"), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["requests_finished"] == 2
    bad = _console("replay", str(tmp_path / "missing.csv"), "--db", str(tmp_path / "k.duckdb"))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [f"kvcap: error: {tmp_path / 'missing.csv'}: no such file"]
    assert _console("--help").returncode == 0 and "replay" in _console("--help").stdout
    assert _console().returncode == 2


def test_the_executable_still_runs_exit_handlers(tmp_path):
    """Spill folders (and worker pools, logging) are cleaned up by exit handlers: they run."""
    code = ("import atexit, sys\nfrom capacity.cli import console\n"
            f"atexit.register(lambda: open({str(tmp_path / 'ran')!r}, 'w').close())\n"
            "sys.argv = ['kvcap', '--help']\nconsole()\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0 and (tmp_path / "ran").exists()


def test_the_command_line_skips_the_uri_grammar_import():
    """`kvcap` blocks rfc3987_syntax (2.5 s of lark grammars under altair's jsonschema), which no
    command needs; a chart still renders without it."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from capacity.cli import console\n"
            "sys.argv = ['kvcap', '--version']\n"
            "try:\n    console()\nexcept SystemExit:\n    pass\n")
    # console() exits the process itself: check in a child that it set the block before main().
    probe = code.replace("console()", "import capacity.cli as c; c.main = lambda: print("
                         "'blocked' if sys.modules.get('rfc3987_syntax', 0) is None else 'no'); "
                         "console()")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "blocked", out.stderr
