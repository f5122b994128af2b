"""V1 waiting queues (vLLM 0.33 `request_queue.py`): a deque for FCFS, a heap for priority.

Both hold trace rows. The priority heap orders by (priority, arrival_s, row); vLLM breaks the last
tie by request id, kvcap by trace row. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np


class FcfsQueue:
    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[int] = deque()

    def add(self, row: int) -> None:
        self._q.append(row)

    def prepend(self, row: int) -> None:
        """A preempted request goes back to the front."""
        self._q.appendleft(row)

    def peek(self) -> int:
        return self._q[0]

    def pop(self) -> int:
        return self._q.popleft()

    def remove(self, row: int) -> None:
        self._q.remove(row)

    def rows(self) -> list[int]:
        return list(self._q)

    def replace_head(self, rows: list[int]) -> None:
        """The first len(rows) entries become `rows` (a permutation of them: 0.34's cache-aware
        admission writes its new order back)."""
        q = self._q
        for _ in rows:
            q.popleft()
        q.extendleft(reversed(rows))

    def __len__(self) -> int:
        return len(self._q)


class PriorityQueue:
    __slots__ = ("_heap", "_priority", "_arrival")

    def __init__(self, *, priority: np.ndarray, arrival_s: np.ndarray) -> None:
        self._heap: list[tuple[int, float, int]] = []
        self._priority = priority.tolist()
        self._arrival = arrival_s.tolist()

    def add(self, row: int) -> None:
        heapq.heappush(self._heap, (self._priority[row], self._arrival[row], row))

    # A heap has no front: a preempted request sorts by its own (priority, arrival).
    prepend = add

    def peek(self) -> int:
        return self._heap[0][2]

    def pop(self) -> int:
        return heapq.heappop(self._heap)[2]

    def remove(self, row: int) -> None:
        self._heap = [e for e in self._heap if e[2] != row]
        heapq.heapify(self._heap)

    def rows(self) -> list[int]:
        """Iteration order of vLLM's `PriorityRequestQueue.__iter__` (it pops a copy of the heap),
        which is what vLLM prints as the waiting queue."""
        return [e[2] for e in sorted(self._heap)]

    def __len__(self) -> int:
        return len(self._heap)
