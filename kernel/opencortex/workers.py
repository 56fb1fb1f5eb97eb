"""Worker threads for code that may hang (skills' phases): a task given up frees the pool.

A Python thread cannot be stopped.  When a task overruns the time its caller
gave it (`run_within`: a skill's prompt or verdict that waits on something
that never comes, or loops), the caller gets TimeoutError and the
pool's threads are replaced by fresh ones for what comes next: a hung task
costs one thread, not the pool.  (Before, two hung prompts held both reading
threads, and every later turn waited for them until its own time ran out.)
The old threads finish what was queued for them and end; the hung one ends
when its task does.  At most MAX_STUCK given-up tasks may still be running:
beyond that the pool is not replaced again (logged; a restart frees them).
(Code that holds the GIL without a break, a regular expression backtracking
in C, stalls every thread; no pool helps there.)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)

MAX_STUCK = 8            # given-up tasks still running, at most, before the pool stays
T = TypeVar("T")


class Workers:
    """SIZE threads named NAME-N, made on first use, running tasks for the event loop."""

    def __init__(self, size: int, name: str, *, max_stuck: int = MAX_STUCK):
        self.size = size
        self.name = name
        self.max_stuck = max_stuck
        self.replaced = 0                        # times the threads were replaced
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stuck: list[Future] = []           # given up, maybe still running

    def submit(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> Future:
        """FUNCTION(*ARGS, **KWARGS) queued for a thread."""
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.size, thread_name_prefix=self.name)
            return self._pool.submit(function, *args, **kwargs)

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """FUNCTION(*ARGS, **KWARGS) run by a thread, so the loop does not wait."""
        return await asyncio.wrap_future(       # run_in_executor, without its checks
            self.submit(function, *args, **kwargs), loop=asyncio.get_running_loop())

    async def run_within(self, limit: float, function: Callable[..., T], *args: Any,
                         **kwargs: Any) -> T:
        """`run`, given up after LIMIT seconds (TimeoutError; see the module)."""
        future = self.submit(function, *args, **kwargs)
        try:
            async with asyncio.timeout(limit):   # no task of its own (wait_for)
                return await asyncio.wrap_future(future, loop=asyncio.get_running_loop())
        except TimeoutError:
            self._give_up(future)
            raise

    @property
    def stuck(self) -> int:
        """Given-up tasks still running."""
        with self._guard:
            return len(self._still_running())

    def _still_running(self) -> list[Future]:
        """The given-up tasks that have not ended (the caller holds the guard)."""
        self._stuck = [future for future in self._stuck if not future.done()]
        return self._stuck

    def _give_up(self, future: Future) -> None:
        """FUTURE's task overran: unless it has not started (it was cancelled then) or
        ended meanwhile, new threads take what comes next."""
        if future.done():
            return
        with self._guard:
            self._stuck = self._still_running() + [future]
            if len(self._stuck) > self.max_stuck:
                log.error("%s: %d tasks overran their time and still run; no more threads "
                          "are made for them (restart the kernel to free them)", self.name,
                          len(self._stuck))
                return
            old, self._pool = self._pool, ThreadPoolExecutor(
                self.size, thread_name_prefix=self.name)
            self.replaced += 1
        if old is not None:
            old.shutdown(wait=False)             # its threads end once their queue is done
        log.warning("%s: a task overran its time and was given up; new threads take the "
                    "next ones (%d given-up task(s) still running)", self.name,
                    len(self._stuck))

    def shutdown(self, *, cancel_futures: bool = False) -> None:
        """Let the threads go (made again if used after)."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=cancel_futures)
