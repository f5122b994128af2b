"""Bad input to `kvcap fleet`, `kvcap plan` and `kvcap sweep`: one line naming the flag, the key
or the file line, exit 2, nothing replayed or written (in-process, typer's runner)."""
import pytest
from typer.testing import CliRunner

from capacity.cli import app

runner = CliRunner()


@pytest.fixture()
def trace(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    return f


@pytest.mark.parametrize("args,says", [
    (["fleet", "{t}", "--replicas", "0"], "--replicas 0"),
    (["fleet", "{t}", "--replicas", "2", "--router", "random"], "--router 'random'"),
    (["plan", "{t}", "--gpu", "h999"], "unknown GPU 'h999'"),
    (["plan", "{t}", "--gpu-price", "h100"], "give GPU=USD"),
    (["plan", "{t}", "--router", "random"], "--router 'random'"),
    (["sweep", "{t}", "--grid", "max_num_seqs=a"], "max_num_seqs='a' is not a number"),
    (["sweep", "{t}", "--grid", "max_num_sequences=4"], "unknown grid key"),
    (["sweep", "{t}"], "give the grid once"),
    (["sweep", "{t}", "--grid", "max_num_seqs=8", "--ray-address", "somewhere"], "--ray-address"),
    (["sweep", "{t}", "--grid", "max_num_seqs=0"], "max_num_seqs"),
    (["sweep", "{t}", "--grid-file", "{g}"], "g.yml:2"),
])
def test_bad_input_is_one_line_exit_2(trace, tmp_path, args, says):
    g = tmp_path / "g.yml"
    g.write_text("grid:\n  max_num_seqs: [8, x]\n")
    db = tmp_path / "out.duckdb"
    res = runner.invoke(app, [a.format(t=trace, g=g) for a in args] + ["--db", str(db)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvcap: error:"), res.output
    assert says in lines[0]
    assert not db.exists()
