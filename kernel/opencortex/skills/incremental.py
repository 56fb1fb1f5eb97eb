"""A fold kept between calls, for lists that mostly grow: a thread's history.

A skill renders its thread's working context into prompt messages every
turn, and from one turn to the next that context usually only grew by the
last exchange.  Rendering it whole costs time in proportion to the length of
the conversation, on every turn.  `IncrementalFold(step)` remembers, per key
(the thread), the items it folded, the argument and the result; when the items
given next start with exactly those (compared by identity first, then by
equality) and the argument is the same, only the new items are folded, onto a
copy of the result.  Anything else (a compressed or rewound context, another
limit) is folded from the start.

The result depends only on the items and the argument, never on what was
remembered, so a key shared by two callers costs time, not correctness.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

KEYS = 512      # keys (threads) remembered at most; the least recently used goes first


class IncrementalFold:
    """STEP(acc, item, arg) folds ITEM onto the list ACC in place (appending to it or
    replacing its last element, never changing an element); calling the fold with a
    key, items and an argument gives the list STEP makes of the items, in order."""

    def __init__(self, step: Callable[[list, Any, Any], None], *, keys: int = KEYS):
        self._step = step
        self._keys = keys
        self._kept: OrderedDict[Hashable, tuple[list, Any, list]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, items: Sequence, arg: Any = None) -> list:
        """ITEMS folded from an empty list (a new list, the caller's to keep)."""
        items = list(items)
        with self._lock:
            kept = self._kept.get(key)
        acc: list = []
        start = 0
        if kept is not None:
            done, done_arg, done_acc = kept
            if done_arg == arg and len(done) <= len(items) and items[:len(done)] == done:
                acc, start = list(done_acc), len(done)
        for item in items[start:]:
            self._step(acc, item, arg)
        with self._lock:
            self._kept[key] = (items, arg, acc)
            self._kept.move_to_end(key)
            while len(self._kept) > self._keys:
                self._kept.popitem(last=False)
        return list(acc)

    def forget(self) -> None:
        """Drop everything remembered."""
        with self._lock:
            self._kept.clear()
