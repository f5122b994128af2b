"""Issue 13, items 5, 7 (trace side), 9 and 11 (trace side): damaged trace files give a valid trace
where the reading is unambiguous, else one line naming the file and line; never a parser traceback;
memory bounded by the requests, not by the time span."""
from __future__ import annotations

import io
from pathlib import Path

import polars as pl
import pytest

from traces.loaders import load_trace
from traces.schema import TraceError
from traces.stats import trace_info

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
ROWS = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.7488340,396,109",
        "2023-11-16 18:15:51.8051010,879,52"]
EXPECTED_PROMPTS = [374, 396, 879]


def write(tmp_path: Path, data: bytes | str, name: str = "azure.csv") -> Path:
    f = tmp_path / name
    f.write_bytes(data.encode() if isinstance(data, str) else data)
    return f


def error_of(path: Path, **kwargs) -> str:
    with pytest.raises(TraceError) as exc:
        load_trace(path, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg and "\r" not in msg and str(path) in msg
    return msg


@pytest.mark.parametrize("eol", ["\r", "\r\n", "\n"])
def test_line_endings_cr_only_crlf_lf_all_read(tmp_path, eol):
    f = write(tmp_path, eol.join([HEADER, *ROWS]) + eol)
    assert load_trace(f)["prompt_tokens"].to_list() == EXPECTED_PROMPTS


def test_cr_only_file_errors_name_the_right_line(tmp_path):
    f = write(tmp_path, "\r".join([HEADER, ROWS[0], ROWS[1], "2023-11-16 18:15:52.0,abc,5"]) + "\r")
    msg = error_of(f)
    assert "line 4" in msg and "ContextTokens" in msg and "'abc'" in msg


def test_utf8_bom_is_accepted(tmp_path):
    f = write(tmp_path, b"\xef\xbb\xbf" + "\n".join([HEADER, *ROWS, ""]).encode())
    assert load_trace(f)["prompt_tokens"].to_list() == EXPECTED_PROMPTS


def test_bom_in_jsonl_and_cr_only_jsonl_are_accepted(tmp_path):
    lines = ['{"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [0, 1]}',
             '{"timestamp": 27, "input_length": 7, "output_length": 4, "hash_ids": [0]}']
    for data in (b"\xef\xbb\xbf" + "\n".join(lines).encode(), "\r".join(lines).encode()):
        df = load_trace(write(tmp_path, data, "m.jsonl"))
        assert df["prompt_tokens"].to_list() == [6, 7] and df["prefix_hashes"].to_list() == [[0, 1], [0]]


def test_padded_fields_and_header_are_accepted(tmp_path):
    f = write(tmp_path, "TIMESTAMP , ContextTokens ,GeneratedTokens\n"
              " 2023-11-16 18:15:46.6805900 , 500 , 44\n2023-11-16 18:15:50.7488340,\t396 ,109\n")
    df = load_trace(f)
    assert df["prompt_tokens"].to_list() == [500, 396] and df["output_tokens"].to_list() == [44, 109]


def test_quoted_fields_are_read_as_csv_means_them(tmp_path):
    f = write(tmp_path, HEADER + '\n"2023-11-16 18:15:46.6805900","1,000",44\n' + ROWS[1] + "\n")
    # "1,000" is one quoted field: not a number, so the error names it (not a field-count error).
    assert "line 2" in error_of(f) and "'1,000'" in error_of(f)
    f = write(tmp_path, HEADER + '\n"2023-11-16 18:15:46.6805900","500",44\n' + ROWS[1] + "\n")
    assert load_trace(f)["prompt_tokens"].to_list() == [500, 396]


def test_trailing_blank_lines_and_trailing_empty_field_are_accepted(tmp_path):
    f = write(tmp_path, "\n".join([HEADER, *ROWS]) + "\n\n\n")
    assert load_trace(f)["prompt_tokens"].to_list() == EXPECTED_PROMPTS
    f = write(tmp_path, "\n".join([HEADER, *(r + "," for r in ROWS)]) + "\n")
    assert load_trace(f)["prompt_tokens"].to_list() == EXPECTED_PROMPTS


def test_extra_field_is_an_error_at_its_line(tmp_path):
    f = write(tmp_path, "\n".join([HEADER, ROWS[0], ROWS[1] + ",17", ROWS[2]]) + "\n")
    msg = error_of(f)
    assert "line 3" in msg and "4 fields, the header has 3" in msg


def test_missing_field_is_an_error_at_its_line(tmp_path):
    f = write(tmp_path, "\n".join([HEADER, ROWS[0], ROWS[1], "2023-11-16 18:15:52.0,5"]) + "\n")
    msg = error_of(f)
    assert "line 4" in msg


def test_stray_quote_is_an_error_at_its_line(tmp_path):
    f = write(tmp_path, "\n".join([HEADER, ROWS[0], '"' + ROWS[1], ROWS[2]]) + "\n")
    msg = error_of(f)
    assert "line 3" in msg and "quote" in msg


def test_quote_inside_a_number_names_the_value(tmp_path):
    f = write(tmp_path, "\n".join([HEADER, ROWS[0], '2023-11-16 18:15:50.7488340,3"96,109']) + "\n")
    msg = error_of(f)
    assert "line 3" in msg and "ContextTokens" in msg


def test_control_characters_are_escaped_in_messages(tmp_path):
    f = write(tmp_path, "TIME\x1b[31mSTAMP,ContextTokens\n1,2\n")
    msg = error_of(f)
    assert "\x1b" not in msg and "\\x1b" in msg


def test_year_9999_is_out_of_range_not_a_decreasing_timestamp(tmp_path):
    f = write(tmp_path, "\n".join([HEADER, ROWS[0], "9999-11-16 18:15:50.7488340,396,109"]) + "\n")
    msg = error_of(f)
    assert "line 3" in msg and "out of range" in msg and "decreases" not in msg


def test_jsonl_nan_hash_names_the_line(tmp_path):
    f = write(tmp_path, '{"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [0]}\n'
              '{"timestamp": 1, "input_length": 6, "output_length": 5, "hash_ids": [NaN]}\n', "m.jsonl")
    msg = error_of(f)
    assert "line 2" in msg and "hash_ids" in msg


@pytest.mark.parametrize("hashes,ok", [(pl.Series([["1", "2"]]), True), (pl.Series([["x"]]), False),
                                       (pl.Series(["1,2"]), False), (pl.Series([[1.5]]), False),
                                       (pl.Series([[-1]]), False)])
def test_parquet_hashes_of_other_types_read_or_error_cleanly(tmp_path, hashes, ok):
    df = pl.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [5],
                       "output_tokens": [3]}).with_columns(prefix_hashes=hashes)
    f = tmp_path / "t.parquet"
    df.write_parquet(f)
    if ok:
        assert load_trace(f)["prefix_hashes"].to_list() == [[1, 2]]
    else:  # 1.5 must not become 1 silently
        assert "prefix_hashes" in error_of(f)


def test_parquet_fractional_request_id_is_not_truncated(tmp_path):
    f = tmp_path / "t.parquet"
    pl.DataFrame({"request_id": [0.0, 1.5], "arrival_s": [0.0, 1.0], "prompt_tokens": [5, 5],
                  "output_tokens": [3, 3]}).write_parquet(f)
    msg = error_of(f)
    assert "row 2" in msg and "request_id" in msg


def test_corrupt_parquet_is_one_line_and_no_panic_report(tmp_path, capfd):
    buf = io.BytesIO()
    pl.DataFrame({"request_id": list(range(50)), "arrival_s": [float(i) for i in range(50)],
                  "prompt_tokens": [5] * 50, "output_tokens": [3] * 50}).write_parquet(buf)
    data = bytearray(buf.getvalue())
    for i in range(8, len(data) - 200, 7):  # damage the pages, keep the footer readable
        data[i] ^= 0x5A
    f = write(tmp_path, bytes(data), "t.parquet")
    try:
        load_trace(f)
    except TraceError as exc:
        assert "\n" not in str(exc)
    assert "panicked" not in capfd.readouterr().err


def test_trace_info_memory_is_bounded_by_requests_not_span(tmp_path):
    # Year 2100 after 2023: 2.4e9 one-second bins (19 GB) if binned by span; a Mooncake time of
    # -1e18 ms: 1.7e13 minute bins (121 TiB).
    f = write(tmp_path, "\n".join([HEADER, ROWS[0], "2100-11-16 18:15:50.7488340,396,109"]) + "\n")
    info = trace_info(load_trace(f))
    assert info["peak_rps"] == 1 and info["peak_rpm"] == 1 and info["requests"] == 2
    f = write(tmp_path, '{"timestamp": -1e18, "input_length": 6, "output_length": 5}\n'
              '{"timestamp": 5, "input_length": 6, "output_length": 5}\n'
              '{"timestamp": 6, "input_length": 6, "output_length": 5}\n', "m.jsonl")
    info = trace_info(load_trace(f))
    assert info["peak_rpm"] == 2 and info["peak_rpm_minute"] == info["peak_tokens_minute"] > 0
    assert info["mean_rpm"] == pytest.approx(3 / (1e15 / 60), rel=1e-6)
