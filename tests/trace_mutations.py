"""Valid small trace files of every format and random mutations of them, for the loader fuzz tests.

`mutate(data, ops)` applies a list of (operation, position, payload) triples to the bytes of a valid
file. The operations are the damage real files show: line endings changed (CR-only, CRLF), a UTF-8
BOM, padded fields, extra or missing fields, stray quotes, dropped or repeated lines, odd values
(NaN, huge, negative, far-future years, control characters) and plain byte flips. Shared by the
default-suite Hypothesis test and `python -m tests.trace_mutations N` (the long run).
"""
from __future__ import annotations

import io
import random
import signal
import sys
import time
from pathlib import Path

import polars as pl

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.7488340,396,109\n"
         "2023-11-16 18:15:51.8051010,879,52\n2023-11-16 18:15:53.7297000,91,16\n")
MOONCAKE = ('{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}\n'
            '{"timestamp": 27, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, 15]}\n'
            '{"timestamp": 3001, "input_length": 600, "output_length": 5, "hash_ids": [3]}\n')
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
            "118,GPT-4,417,276,693,API log\n120,GPT-4,30,7,37,API log\n")
VIDUR = ("arrived_at,num_prefill_tokens,num_decode_tokens,pd_ratio\n"
         "0.5,100,20,5.0\n1.25,200,10,20.0\n2.0,64,8,8.0\n")
GENERIC_CSV = "arrival_s,prompt_tokens,output_tokens,priority,tenant\n0.0,5,6,0,a\n0.5,7,8,1,b\n0.2,9,3,0,a\n"


def _kvcap_parquet() -> bytes:
    from traces.schema import SCHEMA
    df = pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.25, 1.5], "prompt_tokens": [5, 70, 9],
                       "output_tokens": [3, 4, 5], "priority": [0, 0, 1], "tenant": ["a", None, "b"],
                       "prefix_hashes": [[1, 2], None, [1]]}, schema=SCHEMA)
    buf = io.BytesIO()
    df.write_parquet(buf)
    return buf.getvalue()


# format name -> (file suffix, valid bytes)
SEEDS: dict[str, tuple[str, bytes]] = {
    "azure": (".csv", AZURE.encode()),
    "mooncake": (".jsonl", MOONCAKE.encode()),
    "burstgpt": (".csv", BURSTGPT.encode()),
    "vidur": (".csv", VIDUR.encode()),
    "generic-csv": (".csv", GENERIC_CSV.encode()),
    "kvcap": (".parquet", _kvcap_parquet()),
}

PAYLOADS = (b'"', b",", b"\r", b"\n", b"\r\n", b" ", b"\t", b"\xef\xbb\xbf", b"\x00", b"\x1b[31m", b"NaN",
            b"-1", b"0", b"1e18", b"-1e18", b"4294967296", b"99999999999999999999999", b"2100", b"9999",
            b"inf", b"{", b"}", b"[", b"]", b":", b"null", b"\xff\xfe", b"12.5", b"", b"\\")
OPS = ("insert", "replace", "delete", "cr_only", "crlf", "bom", "pad", "extra_field", "drop_field",
       "dup_line", "drop_line", "flip")


def _line_bounds(data: bytes, pos: int) -> tuple[int, int]:
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    return start, (len(data) if end < 0 else end)


def mutate_once(data: bytes, op: str, pos: int, payload: bytes) -> bytes:
    pos = pos % (len(data) + 1)
    if op == "insert":
        return data[:pos] + payload + data[pos:]
    if op == "replace":
        return data[:pos] + payload + data[pos + max(1, len(payload)):]
    if op == "delete":
        return data[:pos] + data[pos + 1 + len(payload) % 4:]
    if op == "cr_only":
        return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r")
    if op == "crlf":
        return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    if op == "bom":
        return b"\xef\xbb\xbf" + data
    if op == "pad":  # spaces around one field
        cut = data.find(b",", pos)
        return data if cut < 0 else data[:cut] + b" , " + data[cut + 1:]
    if op == "extra_field":
        _, end = _line_bounds(data, pos)
        return data[:end] + b"," + payload + data[end:]
    if op == "drop_field":
        start, end = _line_bounds(data, pos)
        line = data[start:end]
        cut = line.rfind(b",")
        return data if cut < 0 else data[:start] + line[:cut] + data[end:]
    if op in ("dup_line", "drop_line"):
        start, end = _line_bounds(data, pos)
        line = data[start:end + 1]
        return data[:start] + (line + line if op == "dup_line" else b"") + data[end + 1:]
    if op == "flip":
        if not data:
            return data
        p = pos % len(data)
        return data[:p] + bytes([data[p] ^ (1 << (len(payload) % 8))]) + data[p + 1:]
    raise ValueError(op)


def mutate(data: bytes, ops: list[tuple[str, int, bytes]]) -> bytes:
    for op, pos, payload in ops:
        data = mutate_once(data, op, pos, payload)
    return data


def check_outcome(path: Path) -> str:
    """'ok' (a canonical trace), or 'error' (a clean one-line TraceError); anything else raises."""
    from traces.loaders import load_trace
    from traces.schema import SCHEMA, TraceError
    try:
        df = load_trace(path)
    except TraceError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "\r" not in msg, f"not one line: {msg!r}"
        assert "\x1b" not in msg and "\x00" not in msg, f"control characters echoed raw: {msg!r}"
        return "error"
    assert dict(df.schema) == SCHEMA and len(df) > 0
    assert df["arrival_s"].is_finite().all() and (df["arrival_s"].diff().drop_nulls() >= 0).all()
    assert (df["prompt_tokens"] > 0).all() and (df["output_tokens"] > 0).all()
    return "ok"


class _Hang(Exception):
    pass


def _raise_hang(signum, frame):
    raise _Hang


def long_run(per_format: int, seed: int = 0, out_dir: Path = Path("/tmp/kvcap-fuzz")) -> dict:
    """`per_format` random mutation sequences per seed file; counts of outcomes, failures kept."""
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, _raise_hang)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, (suffix, data) in SEEDS.items():
        counts = {"ok": 0, "error": 0, "traceback": 0, "hang": 0, "slow": 0}
        for i in range(per_format):
            ops = [(rng.choice(OPS), rng.randrange(1 << 16), rng.choice(PAYLOADS))
                   for _ in range(rng.randint(1, 4))]
            path = out_dir / f"{name}-{i}{suffix}"
            path.write_bytes(mutate(data, ops))
            t0 = time.perf_counter()
            signal.alarm(30)  # a hang shows up as _Hang, counted apart from tracebacks
            try:
                counts[check_outcome(path)] += 1
                path.unlink()
            except _Hang:
                counts["hang"] += 1
                print(f"{path}: hang", file=sys.stderr)
            except BaseException as exc:  # noqa: BLE001 - the point is to count every escape
                if isinstance(exc, KeyboardInterrupt):
                    raise
                counts["traceback"] += 1
                print(f"{path}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            finally:
                signal.alarm(0)
            if time.perf_counter() - t0 > 5.0:
                counts["slow"] += 1
        summary[name] = counts
    return summary


if __name__ == "__main__":
    print(long_run(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
