"""The nearest of message vectors held in memory: a brute-force dot product.

`VectorStore` (see `vectors`) keeps each thread's vectors in a `VectorBlock`
and asks `nearest` for the best of a scope.  With numpy, when it is installed
(an embedding model's library brings it), every score is computed at once and
the best are picked by a partial sort: about 7 ms for 100k 384-dimension
vectors here (a loop over them in Python took ~30 ms more).  Without it, plain
Python scores each vector (~11 us for 384 dimensions) and keeps the best in a
heap.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, field
from operator import mul
from typing import Any


@dataclass
class VectorBlock:
    """One thread's vectors in memory: ids, epochs and the float32 data, row by row
    (a bytearray grows in place: adding a vector does not copy the others)."""

    ids: list[str] = field(default_factory=list)
    epochs: array = field(default_factory=lambda: array("d"))
    data: bytearray = field(default_factory=bytearray)

    def add(self, id_: str, epoch: float, vector: bytes) -> None:
        """Append one message's vector."""
        self.ids.append(id_)
        self.epochs.append(epoch)
        self.data += vector


_numpy: Any = None


def _numpy_module() -> Any:
    """numpy when it is installed (an embedding model's library brings it), else False."""
    global _numpy
    if _numpy is None:
        try:
            import numpy      # optional: only when it is installed anyway
            _numpy = numpy
        except ImportError:
            _numpy = False
    return _numpy


def nearest(blocks: list[VectorBlock], query: array, limit: int, *, since: float,
            exclude: set[str], window: tuple[float, float] | None
            ) -> list[tuple[str, float]]:
    """(id, cosine) of the LIMIT vectors of BLOCKS nearest QUERY (unit length), best
    first: none said before SINCE or in EXCLUDE, and those said within WINDOW first."""
    if _numpy_module():
        return _nearest_numpy(blocks, query, limit, since, exclude, window)
    best: list[tuple[bool, float, str]] = []
    for block in blocks:
        for i, score in enumerate(_scores(block.data, query)):
            epoch = block.epochs[i]
            if epoch < since or block.ids[i] in exclude:
                continue
            inside = window is not None and window[0] <= epoch < window[1]
            item = (inside, score, block.ids[i])
            if len(best) < limit:
                heapq.heappush(best, item)
            elif item > best[0]:
                heapq.heapreplace(best, item)
    return [(id_, score) for _, score, id_ in sorted(best, reverse=True)]


def _nearest_numpy(blocks: list[VectorBlock], query: array, limit: int, since: float,
                   exclude: set[str], window: tuple[float, float] | None
                   ) -> list[tuple[str, float]]:
    """`nearest` with numpy: every score at once, the best of each tier (said within
    WINDOW, then the rest) picked by a partial sort."""
    np = _numpy
    owners = [block for block in blocks if block.ids]
    if not owners:
        return []
    score = np.concatenate([_score_array(block.data, query) for block in owners])
    epochs = np.concatenate([np.array(block.epochs, dtype=np.float64) for block in owners])
    searched = epochs >= since
    tiers = [searched] if window is None else [
        searched & (epochs >= window[0]) & (epochs < window[1]),     # said within it: first
        searched & ((epochs < window[0]) | (epochs >= window[1]))]
    ends = np.cumsum([len(block.ids) for block in owners])
    wanted = limit + len(exclude)             # enough to keep LIMIT of them
    found: list[tuple[str, float]] = []
    for tier in tiers:
        for i in _best(np, score, np.flatnonzero(tier), wanted):
            number = int(np.searchsorted(ends, i, side="right"))
            id_ = owners[number].ids[i - (int(ends[number - 1]) if number else 0)]
            if id_ not in exclude:
                found.append((id_, float(score[i])))
                if len(found) == limit:
                    return found
    return found


def _best(np: Any, score: Any, candidates: Any, count: int) -> list[int]:
    """The COUNT of CANDIDATES (indexes into SCORE) with the highest scores, best first."""
    if len(candidates) > count:
        candidates = candidates[np.argpartition(-score[candidates], count - 1)[:count]]
    return candidates[np.argsort(-score[candidates], kind="stable")].tolist()


def _score_array(data: bytearray, query: array) -> Any:
    """The dot product of QUERY with each float32 row of DATA, as a numpy array (numpy
    installed).  No view of DATA outlives the call (DATA must stay resizable)."""
    np = _numpy
    rows = np.frombuffer(data, dtype=np.float32).reshape(-1, len(query))
    try:
        return rows @ np.frombuffer(query.tobytes(), dtype=np.float32)
    finally:
        del rows


def _scores(data: bytearray, query: array) -> list[float]:
    """The dot product of QUERY with each float32 row of DATA, in plain Python."""
    if not data:
        return []
    dimensions = len(query)
    q = query.tolist()
    with memoryview(data) as raw, raw.cast("f") as values:
        return [sum(map(mul, q, values[start:start + dimensions]))
                for start in range(0, len(values), dimensions)]
