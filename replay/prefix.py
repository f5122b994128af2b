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

_K_BITS = 24  # engine blocks per request < 2**24 (268M tokens at block_size 16)


class BlockKeys(Protocol):
    """Negative keys are request-unique (`unique_key`) and, within a request, follow all of its
    shared (>= 0) keys (replay/kvcore.h `key_of` computes the same keys)."""

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
        return -((row << _K_BITS) | k) - 1

    def keys(self, row: int, start: int, stop: int) -> list[int]:
        return _unique_keys(row, start, stop)


def _unique_keys(row: int, start: int, stop: int) -> list[int]:
    """unique_key(row, k) for k in start..stop-1: a C-level range."""
    base = -(row << _K_BITS) - 1
    return list(range(base - start, base - stop, -1))


class TraceBlockKeys:
    def __init__(self, *, block_size: int, prompt_len: Sequence[int],
                 prefix_hashes: Sequence[Sequence[int] | None],
                 hash_block_tokens: int = 512) -> None:
        self.block_size = block_size
        self.hash_block_tokens = hash_block_tokens
        # Per row: chain ids, one per trace hash (None when the row has no hashes).
        chains: dict[tuple[int, int], int] = {}
        self._chain: list[list[int] | None] = []
        for hashes in prefix_hashes:
            if hashes is None or len(hashes) == 0:
                self._chain.append(None)
                continue
            ids, parent = [], -1
            for h in hashes:
                cid = chains.setdefault((parent, int(h)), len(chains))
                ids.append(cid)
                parent = cid
            self._chain.append(ids)
        # Per row: how many leading engine blocks have shareable keys (covered by the hashes).
        self._shared = [0 if ids is None else
                        min(len(ids) * hash_block_tokens, int(p)) // block_size
                        for ids, p in zip(self._chain, prompt_len)]

    def num_shared_blocks(self, row: int) -> int:
        """How many leading engine blocks of `row` have shareable keys."""
        return self._shared[row]

    def key(self, row: int, k: int) -> int:
        ids = self._chain[row]
        if k < self._shared[row]:
            j = ((k + 1) * self.block_size - 1) // self.hash_block_tokens
            return (ids[j] << _K_BITS) | k
        return -((row << _K_BITS) | k) - 1

    def keys(self, row: int, start: int, stop: int) -> list[int]:
        return [self.key(row, k) for k in range(start, stop)]


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
