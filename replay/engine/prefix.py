"""Content keys of KV blocks, chained like vLLM's block hashes (reference B5, A8).

A block's key stands for (all tokens before it, its own tokens): two requests share a cached block
only when their keys are equal. Keys are Python ints that fit in an int64 (the compiled cores keep
them as int64). `keys(row, start, stop)` gives a run of them in one call. Two sources:

- `TraceBlockKeys`: from a trace's `prefix_hashes` (one hash per `hash_block_tokens` prompt tokens,
  e.g. Mooncake's 512). Engine block k of a prompt is shared when every trace block it touches is
  covered by hashes; its key is (id of the hash chain up to the last trace block it touches, k).
  All other blocks (no hashes, generated tokens, prompt tail beyond the hashes) are unique to the
  request, which is what lets a preempted request re-hit its own blocks and nobody else's.
- `TokenBlockKeys`: from explicit token ids (the oracle scenarios); exact content hashing.

Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

_K_BITS = 24  # engine blocks per request < 2**24 (268M tokens at block_size 16)


class BlockKeys(Protocol):
    """Negative keys are request-unique (`unique_key`) and, within a request, follow all of its
    shared (>= 0) keys (replay/engine/kvcore.h `key_of` computes the same keys)."""

    def key(self, row: int, k: int) -> int:
        """Key of block k (0-based) of request `row`; only asked for blocks whose tokens are all
        known (prompt + output produced so far)."""
        ...

    def keys(self, row: int, start: int, stop: int) -> list[int]:
        """Keys of blocks start..stop-1 of `row` (same rule as `key`), in one call."""
        ...


def unique_key(row: int, k: int) -> int:
    """A key no other request can have (negative, so it never collides with shared keys)."""
    return -((row << _K_BITS) | k) - 1


class UniqueBlockKeys:
    """No sharing between requests (a trace without prefix information)."""

    def key(self, row: int, k: int) -> int:
        return unique_key(row, k)

    def keys(self, row: int, start: int, stop: int) -> list[int]:
        return _unique_keys(row, start, stop)


def _unique_keys(row: int, start: int, stop: int) -> list[int]:
    """unique_key(row, k) for k in start..stop-1: a C-level range."""
    base = -(row << _K_BITS) - 1
    return list(range(base - start, base - stop, -1))


class TraceBlockKeys:
    """Keys from a trace's prefix hashes, kept as flat arrays: `chain_ids[offsets[r]:offsets[r+1]]`
    are row r's chain ids (one per trace hash; none when the row has no hashes) and
    `shared_blocks[r]` how many of its leading engine blocks have shareable keys. The compiled
    cores take these arrays as they are (replay/engine/compiled.py `keys_args`)."""

    def __init__(self, *, block_size: int, prompt_len: Sequence[int],
                 prefix_hashes: Sequence[Sequence[int] | None],
                 hash_block_tokens: int = 512) -> None:
        """`prefix_hashes`: per row its hashes (None or empty: none); any hashable values,
        equal ones stand for equal trace blocks."""
        codes: dict = {}
        lens = np.fromiter((0 if h is None else len(h) for h in prefix_hashes), np.int64)
        flat = np.fromiter((codes.setdefault(x, len(codes))
                            for h in prefix_hashes if h is not None for x in h), np.int64)
        self._init(block_size, prompt_len, flat, row_offsets(lens), hash_block_tokens)

    @classmethod
    def from_flat(cls, *, block_size: int, prompt_len: np.ndarray, hashes: np.ndarray,
                  offsets: np.ndarray, hash_block_tokens: int = 512) -> "TraceBlockKeys":
        """From all rows' hashes in one array (row r's are hashes[offsets[r]:offsets[r+1]]):
        a trace's `prefix_hashes` without a Python object per hash."""
        self = cls.__new__(cls)
        self._init(block_size, prompt_len, hashes, np.asarray(offsets, np.int64),
                   hash_block_tokens)
        return self

    def _init(self, block_size: int, prompt_len, hashes: np.ndarray,
              offsets: np.ndarray, hash_block_tokens: int) -> None:
        self.block_size = block_size
        self.hash_block_tokens = hash_block_tokens
        self.offsets = offsets
        self.chain_ids = chain_ids(hashes, offsets)
        lens = np.diff(offsets)
        self.shared_blocks = np.minimum(lens * hash_block_tokens,
                                        np.asarray(prompt_len, np.int64)) // block_size
        self._lists: tuple[list[int], list[int], list[int]] | None = None

    def _as_lists(self) -> tuple[list[int], list[int], list[int]]:
        """(offsets, chain ids, shared blocks) as Python ints: what the reference scheduler's
        per-block lookups index (numpy scalars are slower to index and are not ints)."""
        if self._lists is None:
            self._lists = (self.offsets.tolist(), self.chain_ids.tolist(),
                           self.shared_blocks.tolist())
        return self._lists

    def num_shared_blocks(self, row: int) -> int:
        """How many leading engine blocks of `row` have shareable keys."""
        return self._as_lists()[2][row]

    def key(self, row: int, k: int) -> int:
        off, ids, shared = self._as_lists()
        if k < shared[row]:
            j = ((k + 1) * self.block_size - 1) // self.hash_block_tokens
            return (ids[off[row] + j] << _K_BITS) | k
        return -((row << _K_BITS) | k) - 1

    def keys(self, row: int, start: int, stop: int) -> list[int]:
        return [self.key(row, k) for k in range(start, stop)]


def row_offsets(lens: np.ndarray) -> np.ndarray:
    """Where each row's run starts in a flat array of all rows' values (and where the last ends):
    offsets[r]:offsets[r+1] are row r's."""
    off = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    return off


def chain_ids(hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The chain id of every hash: rows' hash sequences form a trie (a node per distinct
    (parent node, hash)), and a node's id is its rank in the order nodes are first met reading
    the rows in order, each from its first hash on. So two rows share the id at position j exactly
    when their first j+1 hashes are equal, and the ids are those a dict filled row by row gives.
    Vectorized one trie level (position in the row) at a time: tens of ms for Mooncake's 288k
    hashes, where a Python loop over them took 0.14 s."""
    n = len(hashes)
    if n == 0:
        return np.zeros(0, np.int64)
    lens = np.diff(offsets)
    level = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], lens)
    # Every level's hashes in row order (a radix sort on a small integer type).
    by_level = np.argsort(level.astype(np.uint16) if lens.max() <= 0xFFFF else level,
                          kind="stable")
    node = np.empty(n, np.int64)          # node of each hash, numbered level by level
    first = np.zeros(n, bool)             # where a node is met first
    start = nodes = 0
    for count in np.bincount(level).tolist():
        at = by_level[start:start + count]
        start += count
        h = hashes[at]
        parent = node[at - 1] if nodes else np.full(count, -1, np.int64)
        order = np.lexsort((h, parent))   # stable: equal nodes stay in row order
        at, h, parent = at[order], h[order], parent[order]
        new = np.empty(count, bool)
        new[0] = True
        np.not_equal(h[1:], h[:-1], out=new[1:])
        new[1:] |= parent[1:] != parent[:-1]
        node[at] = np.cumsum(new) + (nodes - 1)
        first[at[new]] = True
        nodes += int(np.count_nonzero(new))
    rank = np.empty(nodes, np.int64)
    rank[node[np.flatnonzero(first)]] = np.arange(nodes)
    return rank[node]


class TokenBlockKeys:
    """Keys from explicit token ids: tokens(row) returns the request's known tokens so far.
    `all_tokens(row)`, when the whole sequence is known in advance (the oracle scenarios: outputs
    are a function of the request), lets the compiled cores take every block key precomputed
    (`precomputed`)."""

    def __init__(self, *, block_size: int, tokens, all_tokens=None) -> None:
        self.block_size = block_size
        self._tokens = tokens
        self.all_tokens = all_tokens
        self._memo: dict[tuple[int, int], int] = {}

    def precomputed(self, n: int) -> list[list[int]]:
        """The keys of every full block of each row's whole sequence (needs `all_tokens`); equal
        to what `key` returns once those tokens are known."""
        full = TokenBlockKeys(block_size=self.block_size, tokens=self.all_tokens)
        return [full.keys(r, 0, len(self.all_tokens(r)) // self.block_size) for r in range(n)]

    def key(self, row: int, k: int) -> int:
        got = self._memo.get((row, k))
        if got is not None:
            return got
        parent = self.key(row, k - 1) if k > 0 else 0
        toks = tuple(self._tokens(row)[k * self.block_size:(k + 1) * self.block_size])
        assert len(toks) == self.block_size, "only full blocks have keys"
        got = hash((parent, toks)) & ((1 << 62) - 1)
        self._memo[(row, k)] = got
        return got

    def keys(self, row: int, start: int, stop: int) -> list[int]:
        return [self.key(row, k) for k in range(start, stop)]
