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

Every turn makes two trips to these threads and back (its preparation, its
verdict), so a trip is kept short: a task is put on a queue its threads
take from, and its outcome is handed to the event loop with one
`call_soon_threadsafe`.  (concurrent.futures' pool with `asyncio.wrap_future`
took twice as long a trip on the 2-core machine: ~100 against ~50 µs.)
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

MAX_STUCK = 8            # given-up tasks still running, at most, before the pool stays
T = TypeVar("T")
_STOP = None             # on the queue: one thread ends
_CANCELLED = object()    # the outcome of a task cancelled before it started


class _Task:
    """One call to make on a thread; DELIVER(ok, value) gets its outcome, unless it
    was cancelled before it started."""

    __slots__ = ("call", "deliver", "state", "_guard")

    def __init__(self, call: Callable[[], Any], deliver: Callable[[bool, Any], None]):
        self.call = call
        self.deliver = deliver
        self.state = "queued"            # then "running" and "done", or "cancelled"
        self._guard = threading.Lock()

    def run(self) -> None:
        with self._guard:
            if self.state != "queued":
                return
            self.state = "running"
        try:
            outcome = (True, self.call())
        except BaseException as error:   # handed to the caller, as concurrent.futures does
            outcome = (False, error)
        self.state = "done"
        self.deliver(*outcome)

    def cancel(self) -> bool:
        """Whether the task was still queued (it never runs now)."""
        with self._guard:
            if self.state != "queued":
                return False
            self.state = "cancelled"
            return True


class _Threads:
    """SIZE threads named NAME_N taking tasks from one queue, until stopped."""

    def __init__(self, size: int, name: str):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.size = size
        self.name = name
        for number in range(size):
            threading.Thread(target=self._serve, name=f"{name}_{number}", daemon=True).start()

    def _serve(self) -> None:
        while (task := self.queue.get()) is not _STOP:
            try:
                task.run()
            except Exception:            # handing the outcome over failed: not expected
                log.exception("%s: an outcome could not be handed over", self.name)
            del task                     # not kept alive while the thread waits

    def stop(self, *, cancel: bool = False) -> None:
        """End the threads once the tasks queued before are done (CANCEL: cancel those)."""
        if cancel:
            while True:
                try:
                    task = self.queue.get_nowait()
                except queue.Empty:
                    break
                if task is not _STOP and task.cancel():
                    task.deliver(False, _CANCELLED)
        for _ in range(self.size):
            self.queue.put(_STOP)


def _settle(waiter: asyncio.Future, ok: bool, value: Any) -> None:
    """Hand an outcome to WAITER (on the loop), unless it is done already (cancelled)."""
    if waiter.done():
        return
    if ok:
        waiter.set_result(value)
    elif value is _CANCELLED:
        waiter.cancel()
    else:
        waiter.set_exception(value)


class Workers:
    """SIZE threads named NAME_N, made on first use, running tasks for the event loop."""

    def __init__(self, size: int, name: str, *, max_stuck: int = MAX_STUCK):
        self.size = size
        self.name = name
        self.max_stuck = max_stuck
        self.replaced = 0                        # times the threads were replaced
        self._guard = threading.Lock()
        self._threads: _Threads | None = None
        self._stuck: list[_Task] = []            # given up, maybe still running

    def _queue(self, task: _Task) -> None:
        with self._guard:
            if self._threads is None:
                self._threads = _Threads(self.size, self.name)
            self._threads.queue.put(task)

    def submit(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> Future:
        """FUNCTION(*ARGS, **KWARGS) queued for a thread; its concurrent Future."""
        future: Future = Future()

        def deliver(ok: bool, value: Any) -> None:
            if value is _CANCELLED:
                future.cancel()
            elif not future.set_running_or_notify_cancel():
                return
            elif ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        self._queue(_Task(lambda: function(*args, **kwargs), deliver))
        return future

    def _start(self, function: Callable[..., T], args: tuple, kwargs: dict
               ) -> tuple[_Task, asyncio.Future]:
        """FUNCTION queued for a thread, and the loop's future of its outcome."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(_settle, waiter, ok, value)
            except RuntimeError:                 # the loop is closed: nobody waits
                pass
        task = _Task(lambda: function(*args, **kwargs), deliver)
        self._queue(task)
        return task, waiter

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """FUNCTION(*ARGS, **KWARGS) run by a thread, so the loop does not wait."""
        task, waiter = self._start(function, args, kwargs)
        try:
            return await waiter
        except asyncio.CancelledError:
            task.cancel()                        # not started: it never runs
            raise

    async def run_within(self, limit: float, function: Callable[..., T], *args: Any,
                         **kwargs: Any) -> T:
        """`run`, given up after LIMIT seconds (TimeoutError; see the module)."""
        task, waiter = self._start(function, args, kwargs)
        try:
            async with asyncio.timeout(limit):   # no task of its own (wait_for)
                return await waiter
        except TimeoutError:
            self._give_up(task)
            raise
        except asyncio.CancelledError:
            task.cancel()
            raise

    @property
    def stuck(self) -> int:
        """Given-up tasks still running."""
        with self._guard:
            return len(self._still_running())

    def _still_running(self) -> list[_Task]:
        """The given-up tasks that have not ended (the caller holds the guard)."""
        self._stuck = [task for task in self._stuck if task.state == "running"]
        return self._stuck

    def _give_up(self, task: _Task) -> None:
        """TASK overran: unless it has not started (it never will now) or ended
        meanwhile, new threads take what comes next."""
        if task.cancel() or task.state != "running":
            return
        with self._guard:
            self._stuck = self._still_running() + [task]
            if len(self._stuck) > self.max_stuck:
                log.error("%s: %d tasks overran their time and still run; no more threads "
                          "are made for them (restart the kernel to free them)", self.name,
                          len(self._stuck))
                return
            old, self._threads = self._threads, _Threads(self.size, self.name)
            self.replaced += 1
        if old is not None:
            old.stop()                           # its threads end once their queue is done
        log.warning("%s: a task overran its time and was given up; new threads take the "
                    "next ones (%d given-up task(s) still running)", self.name,
                    len(self._stuck))

    def shutdown(self, *, cancel_futures: bool = False) -> None:
        """Let the threads go (made again if used after); CANCEL_FUTURES: what is queued
        is cancelled instead of run."""
        with self._guard:
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.stop(cancel=cancel_futures)
