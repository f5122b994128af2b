"""Python code lines of replay/ (issue 15's "engine lines" target), now and at a base commit.

A code line is a line holding a Python token other than a comment or a docstring (blank lines,
comments and docstrings do not count: the reference is meant to carry comments). The stub
(replay/stub/; before issue 33, replay/stub*.py) and its calibration (replay/calibration/stub_fit.py;
replay/calibrate.py) are excluded, as the issue counts. Paths of both layouts are grouped alike.
Modules are grouped by what they do so that a like-for-like comparison can leave out what was
added for other features after the base (the offloading connector, measured step profiles, fleets).

    .venv/bin/python bench/engine_lines.py --base 0294f21c^   # the last commit with the steady path
"""
from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import PurePosixPath

ROOT = PurePosixPath("replay")
# Groups (first match wins). "engine" is what the steady fast path, the step-by-step schedulers
# and the loop made of it at the base: scheduling, block accounting, the replay loop.
GROUPS = (
    ("offloading connector (#16)", ("v1/offload.py", "v1/cpu_tier.py")),
    ("compiled-core adapter", ("compiled.py", "v0/core.py", "v1/core.py")),
    ("engine: schedulers, pools, loop", ("v0/", "v1/", "loop.py", "plan.py", "state.py", "prefix.py")),
    ("run assembly, results, divergence", ("run.py", "raw.py", "results.py", "tables.py",
                                          "divergence.py", "spec.py", "executors.py")),
    ("step time: cost model, profiles (#18)", ("cost_model.py", "step_profile.py", "memory.py")),
    ("production fits (#18)", ("bench_fit.py", "log_fit.py")),
    ("fleets, routing (#19)", ("fleet.py", "routing.py", "fleet/")),
    ("config, catalog, store", ("config.py", "catalog.py", "store.py", "writer.py", "dbfile.py",
                                "__init__.py")),
)
# Since issue 33 these sub-packages' modules are grouped by their name inside the package.
SUBPACKAGES = ("engine", "timing", "results", "calibration")


def code_lines(source: str) -> int:
    """Lines with a code token that is not part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return len(lines)


def counted(path: str) -> bool:
    rel = PurePosixPath(path).relative_to(ROOT)
    return (path.endswith(".py") and not rel.name.startswith(("stub", "calibrate"))
            and rel.parts[0] != "stub")


def group_of(path: str) -> str:
    rel = PurePosixPath(path).relative_to(ROOT)
    if rel.parts[0] in SUBPACKAGES and len(rel.parts) > 1:
        rel = rel.relative_to(rel.parts[0])
    rel = str(rel)
    for group, prefixes in GROUPS:
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes):
            return group
    return "other"


def count(rev: str | None) -> dict[str, int]:
    """Code lines per module at `rev` (None: the working tree)."""
    if rev is None:
        from pathlib import Path
        files = {str(p): p.read_text() for p in Path(ROOT).rglob("*.py")}
    else:
        names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, str(ROOT)], check=True,
                               capture_output=True, text=True).stdout.split()
        files = {n: subprocess.run(["git", "show", f"{rev}:{n}"], check=True, capture_output=True,
                                   text=True).stdout for n in names if n.endswith(".py")}
    return {path: code_lines(src) for path, src in sorted(files.items()) if counted(path)}


def by_group(lines: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys([g for g, _ in GROUPS] + ["other"], 0)
    for path, n in lines.items():
        out[group_of(path)] += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="git revision to compare with (e.g. 0294f21c^)")
    args = ap.parse_args()
    now = by_group(count(None))
    base = by_group(count(args.base)) if args.base else None
    print("| group | code lines" + (" at base | now | change |" if base else " |"))
    print("|---|---:" + ("|---:|---:|" if base else "|"))
    for group in now:
        if base:
            if now[group] or base[group]:
                change = f"{now[group] / base[group] - 1:+.0%}" if base[group] else "new"
                print(f"| {group} | {base[group]:,} | {now[group]:,} | {change} |")
        elif now[group]:
            print(f"| {group} | {now[group]:,} |")
    total = sum(now.values())
    if base:
        print(f"| **all of replay/** | {sum(base.values()):,} | {total:,} | "
              f"{total / sum(base.values()) - 1:+.0%} |")
    else:
        print(f"| **all of replay/** | {total:,} |")


if __name__ == "__main__":
    main()
