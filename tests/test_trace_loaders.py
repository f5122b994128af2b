"""Loaders: every supported format into the canonical trace (DESIGN §3), detection, round trips."""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from traces.loaders import load_trace, load_trace_with_report, write_trace
from traces.schema import SCHEMA, TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces not present")


def write(path: Path, text: str, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode())
    return path


def assert_canonical(df: pl.DataFrame) -> None:
    assert df.schema == pl.Schema(SCHEMA)
    assert df["arrival_s"][0] == 0.0
    assert (df["arrival_s"].diff().drop_nulls() >= 0).all()
    assert df["request_id"].n_unique() == len(df)


@needs_shared
@pytest.mark.parametrize("name,fmt,rows", [("AzureLLMInferenceTrace_code.csv", "azure", 8819),
                                           ("AzureLLMInferenceTrace_conv.csv", "azure", 19366),
                                           ("conversation_trace.jsonl", "mooncake", 12031)])
def test_shared_traces_load_and_detect(name, fmt, rows):
    df, report = load_trace_with_report(SHARED / name)
    assert report.format == fmt and report.rows_read == rows == len(df)
    assert_canonical(df)


@needs_shared
def test_mooncake_hashes_are_uint64_lists():
    df = load_trace(SHARED / "conversation_trace.jsonl")
    assert df["prefix_hashes"][0].to_list() == list(range(14))
    n_blocks = df["prefix_hashes"].list.len()
    assert (n_blocks == (df["prompt_tokens"] + 511) // 512).all()


def test_azure_crlf_no_final_newline_keeps_seven_digits(tmp_path):
    f = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:46.6805901,10,2\n"
              "2023-11-16 18:15:50.9951690,396,109", newline="\r\n")
    df, report = load_trace_with_report(f)
    assert report.format == "azure" and len(df) == 3
    assert df["arrival_s"].to_list() == [0.0, 1e-7, 4.314579]
    assert df["prompt_tokens"].to_list() == [374, 10, 396]
    assert df["request_id"].to_list() == [0, 1, 2]
    assert report.time_origin == "2023-11-16 18:15:46.6805900"


def test_azure_2024_timestamps_with_offset_and_no_fraction(tmp_path):
    f = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2024-05-10 00:00:00.009930+00:00,5,6\n2024-05-10 00:00:01+00:00,7,8\n")
    assert load_trace(f)["arrival_s"].to_list() == pytest.approx([0.0, 0.99007])


def test_mooncake_jsonl(tmp_path):
    f = write(tmp_path / "m.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
              '{"timestamp": 3001, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
    df = load_trace(f)
    assert df["arrival_s"].to_list() == [0.0, 3.001]
    assert df["prefix_hashes"].to_list() == [[0, 1], [0]]


def test_burstgpt_failures_are_counted_not_silently_dropped(tmp_path):
    f = write(tmp_path / "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "5,ChatGPT,472,18,490,Conversation log\n"
              "45,ChatGPT,1087,0,1087,Conversation log\n"
              "118,GPT-4,417,276,693,API log\n")
    df, report = load_trace_with_report(f)
    assert report.format == "burstgpt"
    assert (report.rows_read, report.requests, report.failed_requests) == (3, 2, 1)
    assert df["request_id"].to_list() == [0, 2]  # the source rows, so the failure's gap is visible
    assert df["arrival_s"].to_list() == [0.0, 113.0]
    assert df["tenant"].to_list() == ["ChatGPT", "GPT-4"]


def test_vidur_processed_csv(tmp_path):
    f = write(tmp_path / "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,pd_ratio\n"
              "0.5,100,20,5.0\n1.25,200,10,20.0\n")
    df, report = load_trace_with_report(f)
    assert report.format == "vidur"
    assert df["arrival_s"].to_list() == [0.0, 0.75]
    assert df["output_tokens"].to_list() == [20, 10]


@pytest.mark.parametrize("unit,scale", [("s", 1.0), ("ms", 1e3), ("us", 1e6)])
def test_generic_csv_with_mapping_and_time_unit(tmp_path, unit, scale):
    f = write(tmp_path / "g.csv", f"t,in,out,user\n{10 * scale},3,4,alice\n{12.5 * scale},5,6,bob\n")
    df = load_trace(f, mapping={"t": "arrival_s", "in": "prompt_tokens", "out": "output_tokens",
                                "user": "tenant"}, time_unit=unit)
    assert df["arrival_s"].to_list() == [0.0, 2.5]
    assert df["tenant"].to_list() == ["alice", "bob"]


def test_generic_csv_timestamp_format(tmp_path):
    f = write(tmp_path / "g.csv", "when,p,o\n16/11/2023 18:15:46.5,3,4\n16/11/2023 18:16:46.5,5,6\n")
    df = load_trace(f, mapping={"when": "arrival_s", "p": "prompt_tokens", "o": "output_tokens"},
                    timestamp_format="%d/%m/%Y %H:%M:%S%.f")
    assert df["arrival_s"].to_list() == [0.0, 60.0]


def test_generic_unsorted_input_is_sorted_stably_and_reported(tmp_path):
    f = write(tmp_path / "g.csv", "arrival_s,prompt_tokens,output_tokens\n5,1,1\n3,2,2\n5,3,3\n3,4,4\n")
    df, report = load_trace_with_report(f)
    assert report.format == "generic" and report.rows_reordered == 4
    assert df["prompt_tokens"].to_list() == [2, 4, 1, 3]  # ties keep file order
    assert df["request_id"].to_list() == [1, 3, 0, 2]
    assert df["arrival_s"].to_list() == [0.0, 0.0, 2.0, 2.0]


def test_generic_jsonl_and_whole_floats(tmp_path):
    f = write(tmp_path / "g.jsonl", '{"ts": 1000, "p": 3.0, "o": 4, "prio": 2}\n\n{"ts": 1500, "p": 5, "o": 6, "prio": 0}\n')
    df = load_trace(f, mapping={"ts": "arrival_s", "p": "prompt_tokens", "o": "output_tokens",
                                "prio": "priority"}, time_unit="ms")
    assert df["arrival_s"].to_list() == [0.0, 0.5]
    assert df["prompt_tokens"].to_list() == [3, 5] and df["priority"].to_list() == [2, 0]


def test_generic_parquet_with_native_datetimes(tmp_path):
    f = tmp_path / "g.parquet"
    pl.DataFrame({"at": [datetime(2024, 1, 1, 0, 0, 0), datetime(2024, 1, 1, 0, 0, 2, 500000)],
                  "in": [10, 20], "out": [1, 2]}).write_parquet(f)
    df = load_trace(f, mapping={"at": "arrival_s", "in": "prompt_tokens", "out": "output_tokens"})
    assert df["arrival_s"].to_list() == [0.0, 2.5]


def test_kvcap_parquet_round_trips_exactly(tmp_path):
    src = pl.DataFrame({"request_id": [7, 3, 9], "arrival_s": [0.0, 0.1 + 0.2, 1e-9 + 5],
                        "prompt_tokens": [1, 600, 3], "output_tokens": [2, 3, 4], "priority": [0, -1, 5],
                        "tenant": ["a", None, "c"], "prefix_hashes": [[1, 2**64 - 1], None, []]},
                       schema=SCHEMA)
    f = tmp_path / "t.parquet"
    write_trace(src, f)
    back, report = load_trace_with_report(f)
    assert report.format == "kvcap"
    assert back.equals(src, null_equal=True) and back.schema == src.schema


@needs_shared
def test_convert_round_trip_of_a_real_trace(tmp_path):
    df = load_trace(SHARED / "conversation_trace.jsonl")
    write_trace(df, tmp_path / "m.parquet")
    assert load_trace(tmp_path / "m.parquet").equals(df, null_equal=True)


def test_unknown_layout_lists_columns_and_how_to_map(tmp_path):
    f = write(tmp_path / "x.csv", "when,in,out\n1,2,3\n")
    with pytest.raises(TraceError) as exc:
        load_trace(f)
    msg = str(exc.value)
    assert "when, in, out" in msg and "--map" in msg and "--time-unit" in msg and "mapping=" in msg


def test_numeric_time_without_unit_is_refused(tmp_path):
    f = write(tmp_path / "x.csv", "when,in,out\n1,2,3\n")
    with pytest.raises(TraceError, match="--time-unit"):
        load_trace(f, mapping={"when": "arrival_s", "in": "prompt_tokens", "out": "output_tokens"})


def test_explicit_format_overrides_detection(tmp_path):
    f = write(tmp_path / "x.txt", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,2\n")
    assert load_trace(f, format="azure")["prompt_tokens"].to_list() == [1]
    with pytest.raises(TraceError, match="unknown format"):
        load_trace(f, format="nope")


def test_traces_package_imports_no_other_layer():
    code = ("import sys, traces.loaders, traces.stats, traces.synth, traces.transforms, traces.validate\n"
            "bad = [m for m in ('replay', 'capacity', 'duckdb', 'torch', 'altair') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
