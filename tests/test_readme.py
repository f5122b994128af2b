"""The README is a user guide (issue 33): at most 250 lines, the two set-up commands as CI runs
them, and every command it shows exists with the flags it uses (docs/cli.md too); every doc it
links to exists."""
import re
import shlex
from pathlib import Path

import pytest
import typer

from capacity.cli import COMMANDS, app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_fits_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_two_setup_commands_are_the_ones_ci_and_make_run():
    assert "make report   # the main job" in README and "make test     # the whole test suite" in README
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^report: ", make, re.M) and re.search(r"^test: ", make, re.M)


def test_every_linked_doc_exists():
    for doc in re.findall(r"\]\(((?:docs|notebooks)/[^)]+)\)", README):
        assert (ROOT / doc).is_file(), doc


def _options(path: tuple[str, ...]) -> set[str]:
    group = typer.main.get_command(app)
    cmd = group.commands[path[0]]
    for sub in path[1:]:
        cmd = cmd.commands[sub]
    return {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}


def _shown_commands(text: str):
    """(command path, flags) of every `$K ...` / `kvcap ...` line in the code blocks."""
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, re.S):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            for part in re.split(r"\s;\s", line.split("  #")[0]):
                if not part.strip().startswith(("$K ", "kvcap ")):
                    continue
                words = shlex.split(part.replace("[", "").replace("]", ""), comments=True)
                if not words or words[0] not in ("$K", "kvcap", ".venv/bin/kvcap"):
                    continue
                path = tuple(words[1:3]) if words[1] == "trace" else (words[1],)
                yield path, [w.split("=")[0] for w in words if w.startswith("-")]


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_every_command_shown_exists_with_its_flags(doc):
    seen = 0
    for path, flags in _shown_commands((ROOT / doc).read_text()):
        assert path[0] in COMMANDS, path
        known = _options(path)
        for flag in flags:
            assert flag in known, f"{doc}: kvcap {' '.join(path)} has no {flag}"
        seen += 1
    assert seen >= 5
