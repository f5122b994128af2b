"""Bad input: one `TraceError` per class, each naming the file, the line (or row) and the column."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traces.loaders import load_trace
from traces.schema import TraceError

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
T0 = "2023-11-16 18:15:46.6805900"
T1 = "2023-11-16 18:15:47.0000000"
T2 = "2023-11-16 18:15:48.0000000"


def error_of(path: Path, **kwargs) -> str:
    with pytest.raises(TraceError) as exc:
        load_trace(path, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def azure(tmp_path: Path, *rows: str) -> Path:
    f = tmp_path / "azure.csv"
    f.write_text(AZURE_HEADER + "\n".join(rows) + "\n")
    return f


def test_missing_column(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text(f"TIMESTAMP,ContextTokens\n{T0},5\n")
    msg = error_of(f, format="azure")
    assert "line 1" in msg and "column 'GeneratedTokens'" in msg and "missing column" in msg


def test_non_numeric_value(tmp_path):
    msg = error_of(azure(tmp_path, f"{T0},5,6", f"{T1},abc,6"))
    assert "line 3" in msg and "column 'ContextTokens'" in msg and "'abc'" in msg


@pytest.mark.parametrize("value", ["0", "-4"])
def test_zero_or_negative_length(tmp_path, value):
    msg = error_of(azure(tmp_path, f"{T0},5,6", f"{T1},5,6", f"{T2},5,{value}"))
    assert "line 4" in msg and "column 'GeneratedTokens'" in msg and "must be > 0" in msg


def test_nan_length(tmp_path):
    msg = error_of(azure(tmp_path, f"{T0},NaN,6"))
    assert "line 2" in msg and "column 'ContextTokens'" in msg and "NaN" in msg


def test_missing_value(tmp_path):
    msg = error_of(azure(tmp_path, f"{T0},5,6", f"{T1},,6"))
    assert "line 3" in msg and "column 'ContextTokens'" in msg and "missing value" in msg


def test_fractional_length(tmp_path):
    msg = error_of(azure(tmp_path, f"{T0},5.5,6"))
    assert "line 2" in msg and "column 'ContextTokens'" in msg and "whole number" in msg


def test_unparsable_timestamp(tmp_path):
    msg = error_of(azure(tmp_path, f"{T0},5,6", "2023-11-16 25:99:00.0000000,5,6"))
    assert "line 3" in msg and "column 'TIMESTAMP'" in msg and "unparsable timestamp" in msg


def test_decreasing_timestamp_in_a_sorted_format(tmp_path):
    msg = error_of(azure(tmp_path, f"{T0},5,6", f"{T2},5,6", f"{T1},5,6"))
    assert "line 4" in msg and "column 'TIMESTAMP'" in msg and "decreases" in msg


def test_decreasing_timestamp_in_mooncake(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 3000, "input_length": 5, "output_length": 6}\n'
                 '{"timestamp": 0, "input_length": 5, "output_length": 6}\n')
    msg = error_of(f)
    assert "line 2" in msg and "column 'timestamp'" in msg and "decreases" in msg


def test_empty_file(tmp_path):
    f = tmp_path / "empty.csv"
    f.write_text("")
    assert "line 1" in error_of(f) and "empty" in error_of(f)


def test_header_without_rows(tmp_path):
    f = tmp_path / "h.csv"
    f.write_text(AZURE_HEADER)
    msg = error_of(f)
    assert "line 2" in msg and "no requests" in msg


def test_wrong_json(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n'
                 '{"timestamp": 3, "input_length": 5, "output_length": 6\n')
    msg = error_of(f)
    assert "line 2" in msg and "column" in msg and "invalid JSON" in msg


def test_wrong_json_type_after_a_blank_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n\n'
                 '{"timestamp": 3, "input_length": "five", "output_length": 6}\n')
    msg = error_of(f)
    assert "line 3" in msg and "column 'input_length'" in msg


def test_json_key_missing_on_a_later_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n\n'
                 '{"timestamp": 3, "input_length": 5}\n')
    msg = error_of(f)
    assert "line 3" in msg and "column 'output_length'" in msg and "missing value" in msg


def test_parquet_text_in_a_length_column_names_the_row(tmp_path):
    f = tmp_path / "g.parquet"
    pl.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": ["5", "x"], "output_tokens": [1, 2]}).write_parquet(f)
    msg = error_of(f)
    assert "row 2" in msg and "column 'prompt_tokens'" in msg


def test_generic_nan_timestamp(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text("t,p,o\n1,2,3\nnan,2,3\n")
    msg = error_of(f, mapping={"t": "arrival_s", "p": "prompt_tokens", "o": "output_tokens"}, time_unit="s")
    assert "line 3" in msg and "column 't'" in msg and "NaN" in msg


def test_duplicate_request_id(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n1,0,2,3\n1,1,2,3\n")
    msg = error_of(f)
    assert "line 3" in msg and "column 'request_id'" in msg and "not unique" in msg


def test_mapping_to_a_missing_column(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text("t,p,o\n1,2,3\n")
    msg = error_of(f, mapping={"time": "arrival_s", "p": "prompt_tokens", "o": "output_tokens"}, time_unit="s")
    assert "line 1" in msg and "column 'time'" in msg and "t, p, o" in msg


def test_burstgpt_with_only_failures(tmp_path):
    f = tmp_path / "b.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,0,472,Conversation log\n")
    assert "failed" in error_of(f)


def test_no_such_file(tmp_path):
    assert "no such file" in error_of(tmp_path / "nope.csv")
