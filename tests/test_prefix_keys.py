"""Trace block keys (replay/engine/prefix.py `TraceBlockKeys`): the vectorized chain ids are the ids a
dict filled row by row gives (node = (parent node, hash), numbered in the order first met), so
`replay()` building keys from the trace's flat hash column keys every block as before."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine.prefix import TraceBlockKeys, _K_BITS, chain_ids
from replay.run import block_keys
from traces.schema import SCHEMA

# Few distinct hashes, so rows share prefixes, diverge and meet the same hash under other parents.
ROWS = st.lists(st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=6)), max_size=12)


def dict_chain_ids(rows) -> list[list[int] | None]:
    """The specification: one dict over (parent id, hash), filled reading the rows in order."""
    chains: dict[tuple[int, int], int] = {}
    out = []
    for hashes in rows:
        if not hashes:
            out.append(None)
            continue
        ids, parent = [], -1
        for h in hashes:
            parent = chains.setdefault((parent, h), len(chains))
            ids.append(parent)
        out.append(ids)
    return out


def flat(rows) -> tuple[np.ndarray, np.ndarray]:
    lens = [len(h) if h else 0 for h in rows]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    hashes = np.array([x for h in rows if h for x in h], np.uint64)
    return hashes, offsets


@settings(max_examples=300, deadline=None)
@given(ROWS)
def test_chain_ids_are_the_dict_ids(rows):
    hashes, offsets = flat(rows)
    want = [i for ids in dict_chain_ids(rows) if ids for i in ids]
    assert chain_ids(hashes, offsets).tolist() == want


@settings(max_examples=100, deadline=None)
@given(ROWS, st.sampled_from([4, 8, 16]), st.sampled_from([8, 16, 32]))
def test_keys_follow_the_chain_of_the_last_trace_block_they_touch(rows, block_size, hbt):
    prompt = [5 + 7 * r for r in range(len(rows))]
    keys = TraceBlockKeys(block_size=block_size, prompt_len=prompt, prefix_hashes=rows,
                          hash_block_tokens=hbt)
    hashes, offsets = flat(rows)
    from_flat = TraceBlockKeys.from_flat(block_size=block_size, prompt_len=np.array(prompt),
                                         hashes=hashes, offsets=offsets, hash_block_tokens=hbt)
    for row, ids in enumerate(dict_chain_ids(rows)):
        shared = 0 if ids is None else min(len(ids) * hbt, prompt[row]) // block_size
        assert keys.num_shared_blocks(row) == from_flat.num_shared_blocks(row) == shared
        want = [(ids[((k + 1) * block_size - 1) // hbt] << _K_BITS) | k if k < shared
                else -((row << _K_BITS) | k) - 1 for k in range(prompt[row] // block_size + 2)]
        got = keys.keys(row, 0, len(want))
        assert got == from_flat.keys(row, 0, len(want)) == want
        assert all(type(k) is int for k in got)


def test_a_null_inside_a_rows_hashes_is_refused():
    trace = pl.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [64],
                          "output_tokens": [1], "priority": [0], "tenant": [None],
                          "prefix_hashes": [[1, None]]}, schema=SCHEMA)
    with pytest.raises(ValueError, match="null"):
        block_keys(trace, 16)
