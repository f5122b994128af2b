"""Issue 34 item 1: an output path never replaces a special file, an input, or a file of another
format. One guard (traces.atomic.check_output) is applied by the CLI before any work and by
`atomic_path` again before its rename; a refusal is one line naming -o and the fix, exit 2."""
from __future__ import annotations

import os
import stat

import pytest
from typer.testing import CliRunner

from capacity.cli import app
from traces import atomic

runner = CliRunner()


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stderr


@pytest.fixture()
def trace(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n1.0,30,4\n")
    return f


def specials(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "target.yml"
    target.write_text("keep me")
    link = tmp_path / "link.yml"
    link.symlink_to(target)
    out = {"fifo": fifo, "symlink": link, "dangling": tmp_path / "dangling.yml"}
    out["dangling"].symlink_to(tmp_path / "nowhere.yml")
    if os.geteuid() == 0:               # a copy of /dev/full (mknod needs root)
        dev = tmp_path / "full"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        out["device"] = dev
    return out


def unchanged(tmp_path, kind, path):
    st = os.lstat(path)
    if kind == "fifo":
        return stat.S_ISFIFO(st.st_mode)
    if kind == "device":
        return stat.S_ISCHR(st.st_mode)
    return stat.S_ISLNK(st.st_mode) and (kind == "dangling" or
                                        (tmp_path / "target.yml").read_text() == "keep me")


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling", "device"])
def test_atomic_write_never_replaces_a_special_file(tmp_path, kind):
    paths = specials(tmp_path)
    if kind not in paths:
        pytest.skip("mknod needs root")
    with pytest.raises(atomic.OutputRefused, match="regular file|symbolic link"):
        atomic.write_text(paths[kind], "groups: []\n")
    assert unchanged(tmp_path, kind, paths[kind])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling", "device"])
@pytest.mark.parametrize("cmd", ["alerts", "synth", "convert"])
def test_cli_output_onto_a_special_file_is_one_line(tmp_path, trace, kind, cmd):
    paths = specials(tmp_path)
    if kind not in paths:
        pytest.skip("mknod needs root")
    out = paths[kind]
    args = {"alerts": ("alerts", trace, "-o", out),
            "synth": ("trace", "synth", "poisson", "--duration-s", "5", "-o", out),
            "convert": ("trace", "convert", trace, "-o", out)}[cmd]
    code, err = run(*args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "-o" in err, err
    assert unchanged(tmp_path, kind, out)


def test_convert_onto_its_own_input_is_refused(trace):
    before = trace.read_bytes()
    code, err = run("trace", "convert", trace, "-o", trace)
    assert code == 2 and "input" in err and len(err.strip().splitlines()) == 1
    assert trace.read_bytes() == before
    code, err = run("alerts", trace, "-o", trace)
    assert code == 2 and trace.read_bytes() == before


@pytest.mark.parametrize("name", ["x.csv", "x.jsonl", "x.json"])
def test_parquet_under_another_formats_extension_is_refused(tmp_path, trace, name):
    out = tmp_path / name
    code, err = run("trace", "synth", "poisson", "--duration-s", "5", "-o", out)
    assert code == 2 and ".parquet" in err and not out.exists()
    code, err = run("trace", "convert", trace, "-o", out)
    assert code == 2 and not out.exists()


def test_rules_under_a_parquet_name_is_refused(tmp_path, trace):
    code, err = run("alerts", trace, "-o", tmp_path / "rules.parquet")
    assert code == 2 and ".yml" in err


def test_regular_outputs_still_written(tmp_path, trace):
    out = tmp_path / "t.parquet"
    out.write_bytes(b"old")                          # an existing regular file is replaced
    code, err = run("trace", "convert", trace, "-o", out)
    assert code == 0, err and out.read_bytes()[:4] == b"PAR1"
    code, err = run("trace", "synth", "poisson", "--duration-s", "5", "-o", tmp_path / "noext")
    assert code == 0, err
