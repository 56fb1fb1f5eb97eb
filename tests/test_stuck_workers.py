"""A skill's code that hangs costs its own turn and one thread, never the kernel's pool.

Recall and a skill's prompt run on the reading threads, a verdict on the judging
threads (`workers.Workers`).  A task that overruns its time is given up and its
pool's threads are replaced, so later turns find free threads: before, two hung
prompts held both reading threads and every later turn failed on its timeout.
Hung tasks here wait on an event the test sets at its end (bounded waits).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from opencortex.events import chat_message
from opencortex.llm import EchoBackend
from opencortex.preparation import Preparation
from opencortex.runtime import build_kernel
from opencortex.verification import judge
from opencortex.workers import Workers

WAIT = 60.0          # seconds a hung task waits at most for the test to release it
TURN_BOUND = 15.0    # seconds one turn may take here


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def test_given_up_tasks_leave_the_pool_free(caplog):
    release = threading.Event()
    workers = Workers(2, "test-workers", max_stuck=3)

    async def scenario():
        for _ in range(3):              # more hung tasks than threads
            with pytest.raises(TimeoutError):
                await workers.run_within(0.05, release.wait, WAIT)
        assert workers.stuck == 3 and workers.replaced == 3
        assert await workers.run_within(5, lambda: "still served") == "still served"
        with pytest.raises(TimeoutError):                        # over max_stuck:
            await workers.run_within(0.05, release.wait, WAIT)   # the pool stays
        assert workers.replaced == 3 and workers.stuck == 4
        release.set()
        assert await workers.run_within(5, lambda: "after") == "after"

    try:
        run(scenario())
    finally:
        release.set()
        workers.shutdown()
    deadline = time.monotonic() + WAIT
    while workers.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers.stuck == 0
    assert "no more threads are made for them" in caplog.text


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def one_thread():
    """A pool of one thread, let go at the end."""
    workers = Workers(1, "test-workers")
    yield workers
    workers.shutdown()


def test_a_task_given_up_before_it_started_costs_nothing(release, one_thread):
    workers = one_thread

    async def scenario():
        first = workers.submit(release.wait, WAIT)
        with pytest.raises(TimeoutError):          # queued behind FIRST, never started
            await workers.run_within(0.05, lambda: "never")
        assert workers.replaced == 0 and workers.stuck == 0
        release.set()
        assert first.result(WAIT) is True

    run(scenario())


def test_a_cancelled_call_never_runs_when_queued_and_errors_reach_the_caller(release, one_thread):
    ran: list[str] = []
    workers = one_thread

    async def scenario():
        first = workers.submit(release.wait, WAIT)
        queued = asyncio.ensure_future(workers.run(ran.append, "never"))
        await asyncio.sleep(0.05)
        queued.cancel()                            # still behind FIRST
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        assert first.result(WAIT) is True
        with pytest.raises(ZeroDivisionError):
            await workers.run(lambda: 1 / 0)
        assert await workers.run(ran.append, "after") is None
        assert ran == ["after"]                    # in order: "never" would come first

    run(scenario())


def test_shutdown_cancelling_what_waits_tells_its_callers(release, one_thread):
    workers = one_thread

    async def scenario():
        first = workers.submit(release.wait, WAIT)
        queued = asyncio.ensure_future(workers.run(lambda: "never"))
        later = workers.submit(lambda: "never")
        await asyncio.sleep(0.05)
        workers.shutdown(cancel_futures=True)
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert later.cancelled()
        release.set()
        assert first.result(WAIT) is True

    run(scenario())


def turns(kernel, chats: list[str]) -> list:
    """A turn in each of CHATS, one after the other, each bounded by TURN_BOUND seconds
    (with the pool held by hung tasks, the next turn waited for a thread until they
    ended: here WAIT seconds, in the kernel for ever)."""
    async def each():
        return [await asyncio.wait_for(kernel.handle(chat_message("hello", "cli", chat)),
                                       TURN_BOUND) for chat in chats]
    return run(each())


def test_hung_prompts_do_not_starve_later_turns(config, monkeypatch, release):
    config = config.model_copy(update={"prepare_timeout": 0.3})
    real = Preparation._prepare

    def prepare(self, event, *args):
        if event.thread.chat_id.startswith("hung"):
            release.wait(WAIT)
        return real(self, event, *args)

    monkeypatch.setattr(Preparation, "_prepare", prepare)
    kernel = build_kernel(config, backend=EchoBackend(), writer=lambda text: None)
    try:
        results = turns(kernel, ["hung-1", "hung-2", "hung-3", "fine"])
        assert [r.status for r in results] == ["failed"] * 3 + ["done"]
        assert "took longer than 0.3 s" in results[0].errors[0]
        assert kernel.conversations._readers.replaced == 3
    finally:
        release.set()
        run(kernel.aclose())


def test_hung_verdicts_do_not_starve_later_turns(config, monkeypatch, release):
    config = config.model_copy(update={"judge_timeout": 0.3, "max_rejections": 0})

    def held_judge(reply, skills, ctx, *args, **kwargs):
        if ctx.event.thread.chat_id.startswith("hung"):
            release.wait(WAIT)
        return judge(reply, skills, ctx, *args, **kwargs)

    monkeypatch.setattr("opencortex.replies.judge", held_judge)
    kernel = build_kernel(config, backend=EchoBackend(), writer=lambda text: None)
    try:
        results = turns(kernel, ["hung-1", "hung-2", "hung-3", "fine"])
        assert [r.status for r in results][-1] == "done"
        assert all(r.status != "done" for r in results[:3])
        assert kernel.replies._judges.replaced == 3
    finally:
        release.set()
        run(kernel.aclose())


def test_the_connections_of_replaced_reading_threads_are_closed(tmp_path):
    """Each given-up task made new reading threads, each opening an index connection of
    its own, and the old threads' connections stayed open until the kernel closed: 30
    overruns left 46 connections and 95 more file descriptors (with many owners, a
    whole schema each)."""
    from opencortex.memory import Archive, NewMessage
    from opencortex.events import Thread
    release = threading.Event()
    workers = Workers(2, "test-readers", max_stuck=3)
    with Archive(tmp_path / "memory") as archive:
        archive.append([NewMessage(role="user", text="a kestrel", thread=Thread("cli", "x"))])

        def slow_read() -> int:
            with archive._readers.reading() as index:
                release.wait(0.3)
                return index.count()

        def read() -> int:
            with archive._readers.reading() as index:
                return index.count()

        async def scenario():
            for _ in range(12):
                with pytest.raises(TimeoutError):
                    await workers.run_within(0.05, slow_read)
                await workers.run(read)
            deadline = time.monotonic() + WAIT
            while workers.stuck and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)                 # the old threads end after their task
            for _ in range(4):
                assert await workers.run(read) == 1
        try:
            run(scenario())
            assert archive._readers.open_connections() <= 2 + workers.max_stuck
        finally:
            release.set()
            workers.shutdown()
