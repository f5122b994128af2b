"""What people expect of a command line (issue 33): `--version`, `-h` beside `--help` on every
command, help that never cuts or splits a flag name at 80 columns, and click's usage errors as
one line naming the command's help."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from capacity.cli import COMMANDS, app

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
runner = CliRunner()


def _commands():
    """(argv path, click command) of every command, `trace`'s subcommands included."""
    group = typer.main.get_command(app)
    out = []
    for name in COMMANDS:
        cmd = group.commands[name]
        subs = getattr(cmd, "commands", None)
        if isinstance(subs, dict):
            out += [((name, sub), c) for sub, c in subs.items()]
        else:
            out.append(((name,), cmd))
    return out


def _flags(cmd) -> list[str]:
    return [o for p in cmd.params if p.param_type_name == "option"
            for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]


def test_version_is_the_package_version():
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"kvcap {want}"
    from replay.run import KVCAP_VERSION            # what every run records
    assert KVCAP_VERSION == want


@pytest.mark.parametrize("path,cmd", _commands(), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_help_at_80_columns_names_every_flag_whole(path, cmd):
    short = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "80"})
    assert short.exit_code == 0, short.output
    assert short.output == runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
    text = short.output
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    words = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", text))
    for flag in _flags(cmd):
        assert flag in words, f"{' '.join(path)}: {flag} cut or missing in --help"
    # No word split at a hyphen across lines: a line never ends in a hyphen.
    assert not [line for line in text.splitlines() if re.search(r"\w-$", line)]


def test_top_level_help_has_h_and_version():
    res = runner.invoke(app, ["-h"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    assert "-h, --help" in res.output and "--version" in res.output


@pytest.mark.parametrize("argv,needle", [
    (["replay", "t.csv", "--rate-scal", "2"], "No such option: --rate-scal"),
    (["replay", "t.csv", "--max-num-seqs", "many"], "'--max-num-seqs'"),
    (["replay"], "Missing argument"),
    (["repla"], "Did you mean 'replay'"),
])
def test_usage_errors_are_one_line_naming_the_help(argv, needle):
    res = subprocess.run([KVCAP, *argv], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("kvcap: error: ") and needle in lines[0]
    assert "-h`" in lines[0]


# ------------------------------------------------------------------ paste-safe shell commands
FLAGS = ("--max-num-seqs", "1024", "--max-num-batched-tokens", "8192", "--enable-prefix-caching",
         "--enable-chunked-prefill", "--scheduling-policy", "fcfs", "--async-scheduling",
         "--kv-offloading-size", "0.015", "--kv-offloading-backend", "native")


def test_the_terminal_prints_the_command_on_one_line_at_any_width():
    import io
    import shlex

    from rich.console import Console

    from capacity.cli.common import print_flags
    for width in (40, 80, 200):
        buf = io.StringIO()
        print_flags(Console(file=buf, width=width), FLAGS)
        lines = buf.getvalue().splitlines()
        assert len(lines) == 2, lines                    # the heading, then the command whole
        assert shlex.split(lines[1]) == ["vllm", "serve", "$MODEL", *FLAGS]


def test_the_report_block_is_one_command_by_backslash_continuations(tmp_path):
    import html
    import re
    import shlex

    from capacity.analyses.flags import serve_lines
    text = serve_lines(FLAGS)
    lines = text.splitlines()
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert shlex.split(text.replace("\\\n", "")) == ["vllm", "serve", "$MODEL", *FLAGS]
    # A real shell reads it as one command.
    script = tmp_path / "argv.sh"
    script.write_text('MODEL=m\nargv() { printf "%s\\n" "$@"; }\n'
                      + text.replace("vllm serve", "argv vllm serve", 1) + "\n")
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["vllm", "serve", "m", *FLAGS]
    # The report shows exactly that block.
    from capacity.report.render import code_block
    shown = re.search(r"<code>(.*)</code>", code_block(text), re.S).group(1)
    assert html.unescape(shown) == text


def test_a_flag_value_with_shell_characters_is_quoted():
    import shlex

    from capacity.analyses.flags import serve_command
    argv = ["--kv-transfer-config", '{"kv_connector": "OffloadingConnector"}']
    assert shlex.split(serve_command(argv))[3:] == argv


def test_the_commands_that_make_the_plan_take_the_same_planning_flags():
    """report, plan and headroom answer from one plan (one capacity, one replica count), so a
    flag one of them takes to shape that plan, the others take too (`headroom --rate-scale` was
    refused while `report` and `plan` took it)."""
    group = typer.main.get_command(app)
    shared = {"--rate-scale", "--target-peak", "--router", "--precision", "--max-num-seqs-grid",
              "--slo-ttft-p99", "--slo-tbt-p99", "--preemption-budget", "--arrivals", "--seed",
              "--hash-block-tokens", "--format", "--workers", "--db", "--json", "--quiet"}
    for name in ("report", "plan", "headroom"):
        missing = shared - set(_flags(group.commands[name]))
        assert not missing, f"kvcap {name} lacks {sorted(missing)}"


@pytest.mark.parametrize("cmd", ["tune", "headroom"])
def test_table_numbers_are_never_cut_by_a_long_verdict(cmd, tmp_path):
    """A starved pool makes verdicts like 'TTFT p99 94.89 s > 5 s; preemption is structural, not
    peak-only; overloaded': they wrap in their column, and no number of the table is cut to '…'
    (`tune` printed '0.…' and '32.…' for its goodput and TTFT, `headroom` '×0…')."""
    from traces.loaders import load_trace, write_trace
    f = tmp_path / "conv.parquet"
    write_trace(load_trace(ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv")
                .head(400), f)
    res = subprocess.run([KVCAP, cmd, str(f), "--num-gpu-blocks-override", "120",
                          "--max-num-seqs-grid", "64,256", "--quiet"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "structural" in res.stdout and "…" not in res.stdout
