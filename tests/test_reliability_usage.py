"""Issue 34 item 10: every usage error click/typer raises (an unknown flag, a flag without its value,
a value that is no number, a missing or extra argument, an unknown command) is one line on stderr,
`kvcap: error: ... (see `kvcap COMMAND -h`)`, exit 2: never typer's 5-line box, never click's
three lines. Run through `main()`, the `kvcap` executable's entry, for every command."""
from __future__ import annotations

import sys

import pytest

from capacity.cli import COMMANDS, click_command, main

BOX = ("╭", "│", "╰", "Usage:", "Try ")


def commands() -> list[tuple[str, ...]]:
    out = []
    for name in COMMANDS:
        if name == "trace":
            out += [("trace", sub) for sub in click_command("trace").commands]
        else:
            out.append((name,))
    return out


def option_of(path: tuple[str, ...], kind: type) -> str | None:
    """The command's first option taking a value of Python type `kind` (int, float)."""
    cmd = click_command(path[0])
    if len(path) > 1:
        cmd = cmd.commands[path[1]]
    for p in cmd.params:
        desc = getattr(p, "type_descriptor", None)
        if (desc is not None and desc.annotation is kind and getattr(p, "opts", None)
                and p.opts[0].startswith("--") and not getattr(p, "is_flag", False)):
            return p.opts[0]
    return None


def cases() -> list[tuple[str, ...]]:
    out = [("no-such-command",), ("trace", "no-such-sub"), ("--no-such-flag",), ("trace", "--nope"),
           ("replay",), ("logs",), ("trace", "info"), ("replay", "a.csv", "b.csv"),
           ("fleet", "t.csv", "--replicas", "abc"), ("replay", "t.csv", "-tp", "x"),
           ("tune", "t.csv", "--gpu"), ("replay", "t.csv", "--scheduler"),
           ("trace", "convert", "x.csv", "-o"), ("report", "--precision", "tight")]
    for path in commands():
        out.append((*path, "--no-such-flag"))
        for kind in (int, float):
            opt = option_of(path, kind)
            if opt:
                out.append((*path, opt, "not-a-number"))
                out.append((*path, opt))            # no value at all
    return out


CASES = cases()


def test_enough_cases_cover_every_command():
    assert len(CASES) >= 60 and {c[0] for c in CASES} >= set(COMMANDS)


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) for c in CASES])
def test_usage_error_is_one_line_naming_the_help(argv, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)       # nothing may be written; if a case ran, it runs here
    monkeypatch.setattr(sys, "argv", ["kvcap", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert e.value.code == 2, (argv, err)
    assert len(lines) == 1 and lines[0].startswith("kvcap: error: "), err
    assert lines[0].endswith("-h`)") and "(see `kvcap" in lines[0], lines[0]
    assert not any(b in err for b in BOX) and out == ""
    assert list(tmp_path.iterdir()) == []
