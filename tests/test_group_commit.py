"""Group commit: the kernel's archive writes run on one writer thread, off the loop.

Turns of different threads that finish while a write is in progress are
committed together (one write and one fsync per file, one index transaction);
each turn completes only once its own write is durable; a failed write fails
exactly the turns of its batch; closing writes what is pending and stops the
thread.  Recall and opening a thread read off the loop, through a connection
of their own.  The writer is paused by holding its fsync (a test hook on
os.fsync, for the writer thread only); every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading

import pytest

from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread, chat_message
from opencortex.llm import EchoBackend
from opencortex.memory import Archive, ArchiveError, NewMessage
from opencortex.memory.index import MessageIndex
from opencortex.runtime import build_kernel

WAIT = 20.0            # seconds any one wait may take before the test fails
THREADS = [Thread("cli", f"group-{n}") for n in range(6)]


class FsyncGate:
    """os.fsync counting its calls; while shut, the writer thread stops at its fsync."""

    def __init__(self) -> None:
        self.real = os.fsync
        self.calls = 0
        self.shut = False
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.shut and threading.current_thread().name.startswith("opencortex-archive"):
            self.entered.set()
            if not self.released.wait(WAIT):
                raise AssertionError("the test never released the writer")
        self.real(fd)

    def hold(self) -> None:
        self.shut = True
        self.entered.clear()
        self.released.clear()

    def release(self) -> None:
        self.shut = False
        self.released.set()

    async def reached(self) -> None:
        """Wait (off the loop) until the writer stopped at the gate."""
        assert await asyncio.to_thread(self.entered.wait, WAIT), "the writer never wrote"


@pytest.fixture
def gate(monkeypatch):
    opened = FsyncGate()
    monkeypatch.setattr(os, "fsync", opened)
    yield opened
    opened.release()


@pytest.fixture
def kernel(config):
    made = build_kernel(config, backend=EchoBackend(), writer=lambda text: None)
    yield made
    made.archive.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=3 * WAIT))


def say(thread: Thread, text: str, role: str = "user") -> NewMessage:
    return NewMessage(role=role, text=text, thread=thread)


async def until(condition, what: str) -> None:
    """Yield to the loop until CONDITION() holds (bounded)."""
    for _ in range(int(WAIT / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def counting_submits(monkeypatch, archive: Archive) -> list[int]:
    """A list that grows by one each time ARCHIVE.submit is called."""
    calls: list[int] = []
    real = archive.submit

    def submit(messages, **kwargs):
        calls.append(len(messages))
        return real(messages, **kwargs)
    monkeypatch.setattr(archive, "submit", submit)
    return calls


async def held_turns(kernel, gate, monkeypatch, threads, text="later"):
    """Start a turn per thread while the writer is held by a blocker write; return the
    tasks once each turn submitted its write."""
    gate.hold()
    blocker = kernel.archive.submit([say(Thread("cli", "blocker"), "hold")])
    await gate.reached()
    submits = counting_submits(monkeypatch, kernel.archive)
    tasks = [asyncio.create_task(kernel.handle(chat_message(f"{text} {n}", t.channel,
                                                             t.chat_id)))
             for n, t in enumerate(threads)]
    await until(lambda: len(submits) == len(threads), "every turn to submit its write")
    return blocker, tasks


def test_concurrent_turns_of_different_threads_share_one_batch(kernel, gate, monkeypatch):
    transactions = []
    real_add = MessageIndex.add_writes
    monkeypatch.setattr(MessageIndex, "add_writes",
                        lambda self, writes: transactions.append(list(writes)) or
                        real_add(self, transactions[-1]))

    async def scenario():
        for n, thread in enumerate(THREADS):       # the files exist: no directory fsyncs
            await kernel.handle(chat_message(f"first {n}", thread.channel, thread.chat_id))
        blocker, tasks = await held_turns(kernel, gate, monkeypatch, THREADS)
        batches, calls, before = kernel.archive.batches, gate.calls, len(transactions)
        assert not any(task.done() for task in tasks)    # waiting for their writes
        gate.release()
        results = await asyncio.gather(*tasks)
        await asyncio.wrap_future(blocker)
        return results, kernel.archive.batches - batches, gate.calls - calls, \
            transactions[before:]

    results, batches, fsyncs, indexed = run(scenario())
    assert [r.status for r in results] == ["done"] * len(THREADS)
    assert batches == 2                     # the blocker's, then all six turns in one
    assert fsyncs == 1 + len(THREADS)       # the blocker's file, then one per file
    assert len(indexed) == 2 and len(indexed[1]) == len(THREADS)   # one transaction
    for thread, result in zip(THREADS, results):
        records = kernel.archive.read_thread(thread)
        assert [r.id for r in records[-2:]] == result.ids
        assert records[-2].parent == records[-3].id       # after the thread's head


def test_appends_to_one_file_in_a_batch_share_its_fsync(tmp_path, gate):
    thread = THREADS[0]

    async def scenario(archive):
        archive.append([say(thread, "first")])    # the file exists: no directory fsync
        gate.hold()
        blocker = archive.submit([say(thread, "hold")])
        await gate.reached()
        futures = [archive.submit([say(thread, f"q{n}"), say(thread, f"a{n}", "assistant")])
                   for n in range(5)]
        calls = gate.calls
        gate.release()
        appended = [await asyncio.wrap_future(f) for f in futures]
        await asyncio.wrap_future(blocker)
        return appended, gate.calls - calls

    with Archive(tmp_path / "memory") as archive:
        appended, fsyncs = run(scenario(archive))
        assert fsyncs == 1                     # five appends, one file, one fsync
        records = archive.read_thread(thread)
        assert [r.text for r in records] == ["first", "hold"] + [
            text for n in range(5) for text in (f"q{n}", f"a{n}")]
        for previous, this in zip(appended, appended[1:]):    # chained as if one by one
            assert this.before[thread] == previous.records[-1].id
            assert this.records[0].parent == previous.records[-1].id
    with Archive(tmp_path / "memory") as reopened:    # whole writes: nothing moved aside
        assert reopened.repair() == [] and len(reopened.read_thread(thread)) == 12


def test_new_threads_in_one_batch_share_their_directory_fsync(tmp_path, gate):
    async def scenario(archive):
        archive.append([say(Thread("cli", "blocker"), "first")])
        gate.hold()
        blocker = archive.submit([say(Thread("cli", "blocker"), "hold")])
        await gate.reached()
        futures = [archive.submit([say(t, "hello")]) for t in THREADS]   # new files
        calls = gate.calls
        gate.release()
        for future in [blocker, *futures]:
            await asyncio.wrap_future(future)
        return gate.calls - calls

    with Archive(tmp_path / "memory") as archive:
        fsyncs = run(scenario(archive))
        assert fsyncs == len(THREADS) + 1       # one per file, one for their directory
        assert all(archive.read_thread(t)[0].text == "hello" for t in THREADS)


def test_a_turn_completes_only_once_its_write_is_durable(kernel, gate):
    thread = THREADS[1]

    async def scenario():
        gate.hold()
        task = asyncio.create_task(kernel.handle(chat_message("durable?", *thread)))
        await gate.reached()                 # written, not yet fsynced: the writer waits
        for _ in range(20):
            await asyncio.sleep(0)           # the loop runs on meanwhile
        assert not task.done()
        conversation = await kernel.conversations.open(thread)
        assert conversation.log.head is None              # memory does not run ahead
        assert b"durable?" in kernel.archive.thread_file(thread).read_bytes()
        gate.release()
        result = await task
        return result, conversation

    result, conversation = run(scenario())
    assert result.status == "done"
    assert conversation.log.head == result.ids[-1]
    assert [r.id for r in kernel.archive.thread_records(thread)] == result.ids


def test_a_failing_write_fails_exactly_the_turns_of_its_batch(kernel, gate, monkeypatch):
    import opencortex.memory.writer as writer

    real_write = writer.write_all
    full = {"on": False}

    def write_all(fd, data):
        if full["on"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)
    monkeypatch.setattr(writer, "write_all", write_all)
    failing, later = THREADS[:3], THREADS[3]

    async def scenario():
        for thread in failing:
            await kernel.handle(chat_message("kept", *thread))
        heads = [(await kernel.conversations.open(t)).log.head for t in failing]
        blocker, tasks = await held_turns(kernel, gate, monkeypatch, failing, text="lost")
        full["on"] = True                    # the disk fills before the batch is written
        gate.release()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wrap_future(blocker)   # written before: unaffected
        full["on"] = False
        again = [await kernel.handle(chat_message("again", *t)) for t in (*failing, later)]
        after = [(await kernel.conversations.open(t)).log for t in failing]
        return outcomes, heads, again, after

    outcomes, heads, again, logs = run(scenario())
    for outcome in outcomes:
        assert isinstance(outcome, ArchiveError)
        assert "No space left on device" in str(outcome) and "free disk space" in str(outcome)
    assert [r.status for r in again] == ["done"] * 4          # the kernel keeps working
    for thread, head, log, result in zip(failing, heads, logs, again):
        texts = [r.text for r in kernel.archive.read_thread(thread)]
        assert not any(text.startswith("lost") or "] lost" in text for text in texts)
        assert log.turn_count() == 2 and log.ancestors()[-2].parent == head
    assert kernel.archive.repair() == []                      # no torn write left behind


def test_closing_writes_what_is_pending_and_stops_the_thread(kernel, gate, monkeypatch):
    async def scenario():
        blocker, tasks = await held_turns(kernel, gate, monkeypatch, THREADS[:4])
        gate.release()
        await kernel.aclose()                # flushes the queue, joins the writer
        assert not kernel.archive._writer.running
        return await asyncio.gather(*tasks), blocker.result(timeout=0)

    results, _ = run(scenario())
    assert [r.status for r in results] == ["done"] * 4
    with pytest.raises(ArchiveError, match="closed"):
        kernel.archive.submit([say(THREADS[0], "after close")])
    with Archive(kernel.archive.root) as reopened:
        for thread, result in zip(THREADS, results):
            assert [r.id for r in reopened.read_thread(thread)] == result.ids


def test_closing_is_bounded_when_a_write_hangs(tmp_path, gate):
    archive = Archive(tmp_path / "memory")
    gate.hold()
    stuck = archive.submit([say(THREADS[0], "stuck")])
    assert gate.entered.wait(WAIT)
    queued = archive.submit([say(THREADS[1], "queued")])
    assert archive._writer.close(timeout=0.2) is False        # gives up, does not hang
    with pytest.raises(ArchiveError, match="closed before"):
        queued.result(timeout=0)
    gate.release()
    assert stuck.result(timeout=WAIT).records[0].text == "stuck"
    archive.close()


def test_a_cancelled_turn_still_reaches_the_log_as_it_reaches_the_file(tmp_path, gate):
    thread = THREADS[2]

    async def scenario(archive):
        log = ThreadLog.load(archive, thread)
        gate.hold()
        task = asyncio.create_task(log.append_turn_async(
            [say(thread, "q"), say(thread, "a", "assistant")], checkpoint=True))
        await gate.reached()
        task.cancel()
        await asyncio.sleep(0)
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        return log

    with Archive(tmp_path / "memory") as archive:
        log = run(scenario(archive))
        on_disk = archive.read_thread(thread)
        assert [r.text for r in on_disk] == ["q", "a"] and log.head == on_disk[-1].id
        assert log.checkpoint()                 # not stale: its view is the file's


def test_recall_and_opening_read_off_the_loop(kernel, monkeypatch):
    import opencortex.conversation.resumable as resumable

    where: dict[str, set[str]] = {"search": set(), "tail": set()}
    real_search, real_tail = kernel.archive.search, resumable.read_tail

    def search(*args, **kwargs):
        where["search"].add(threading.current_thread().name)
        return real_search(*args, **kwargs)

    def read_tail(*args, **kwargs):
        where["tail"].add(threading.current_thread().name)
        return real_tail(*args, **kwargs)
    monkeypatch.setattr(kernel.archive, "search", search)
    monkeypatch.setattr(resumable, "read_tail", read_tail)

    async def scenario():
        await kernel.handle(chat_message("the lighthouse keeper", *THREADS[3]))
        kernel.conversations._open.clear()            # as after a start: read the file
        result = await kernel.handle(chat_message("lighthouse?", *THREADS[3]))
        return threading.current_thread().name, result

    loop_thread, result = run(scenario())
    assert result.status == "done"
    assert where["search"] and loop_thread not in where["search"]
    assert where["tail"] and loop_thread not in where["tail"]


def test_searches_do_not_wait_for_the_writer(tmp_path, gate):
    async def scenario(archive):
        archive.append([say(THREADS[0], "a lighthouse on the cape")])
        gate.hold()
        pending = archive.submit([say(THREADS[1], "more words")])
        await gate.reached()                 # the writer holds the archive's lock
        hits = await asyncio.wait_for(asyncio.to_thread(archive.search, "lighthouse"), WAIT)
        gate.release()
        await asyncio.wrap_future(pending)
        return hits

    with Archive(tmp_path / "memory") as archive:
        hits = run(scenario(archive))
        assert [hit.text for hit in hits] == ["a lighthouse on the cape"]
        assert archive.search("words")[0].text == "more words"   # the reader sees the commit


def test_a_command_beside_a_pending_turn_applies_after_it_in_file_order(tmp_path, gate):
    thread = THREADS[4]

    async def scenario(archive):
        log = ThreadLog.load(archive, thread)
        first = log.append_turn([say(thread, "q1"), say(thread, "a1", "assistant")])
        gate.hold()
        task = asyncio.create_task(log.append_turn_async(
            [say(thread, "q2"), say(thread, "a2", "assistant")], checkpoint=True))
        await gate.reached()
        threading.Timer(0.2, gate.release).start()   # frees the writer while pin waits
        log.pin(first[0].id)         # a command (as from Emacs), written in this thread
        second = await task
        return log, second

    with Archive(tmp_path / "memory") as archive:
        log, second = run(scenario(archive))
        texts = [r.text for r in archive.read_thread(thread) if r.role != "system"]
        assert texts[:4] == ["q1", "a1", "q2", "a2"]
        reread = ThreadLog.load(archive, thread)
        assert log.head == reread.head == second[-1].id
        assert log.pins() == reread.pins() and log.turn_count() == reread.turn_count() == 2
        assert log.checkpoint()                 # its view is still the file's


def test_slash_commands_write_off_the_loop(kernel, monkeypatch):
    """A command's control records (fork, switch, merge, pin, strategy, rewind, reset,
    load) and a saved session are written and fsynced by a reading thread, never by
    the event loop's; while one waits for its disk, the loop runs on (a view of the
    chat answers).  Before, each of them held the loop for its fsync."""
    import re
    loop_thread = threading.current_thread()         # asyncio.run runs the loop here
    on_loop: list[int] = []
    held, release, holding = threading.Event(), threading.Event(), [False]

    def fsync(fd: int) -> None:
        if threading.current_thread() is loop_thread:
            on_loop.append(fd)
        if holding[0] and threading.current_thread().name.startswith("opencortex-reader"):
            held.set()
            assert release.wait(WAIT), "the test never released the command's write"
        real(fd)
    real = os.fsync
    monkeypatch.setattr(os, "fsync", fsync)

    async def command(text: str) -> str:
        result = await kernel.handle(chat_message(text, "cli", "commands"))
        assert result.status == "done", (text, result.errors)
        return result.text

    async def main() -> None:
        for text in ("first question", "second question"):
            await kernel.handle(chat_message(text, "cli", "commands"))
        branch = re.search(r"branch (\S+) at", await command("/fork 1")).group(1)
        for text in ("/switch main", f"/merge {branch}", "/pin 1", "/unpin 1",
                     "/strategy forget", "/save kept", "/rewind 1", "/reset", "/load kept",
                     "/sessions", "/recall question"):
            await command(text)
        assert on_loop == []
        holding[0] = True
        forking = asyncio.ensure_future(command("/fork"))
        assert await asyncio.to_thread(held.wait, WAIT), "the command wrote nothing"
        shown = await asyncio.wait_for(kernel.view(Thread("cli", "commands")), WAIT)
        for _ in range(3):                  # the loop runs on: timers fire, views answer
            await asyncio.sleep(0.01)
        assert shown["branch"] and not forking.done()
        holding[0] = False
        release.set()
        assert "Forked branch" in await asyncio.wait_for(forking, WAIT)
    try:
        run(main())
    finally:
        release.set()


def test_emacs_reload_skills_compiles_off_the_loop(kernel, monkeypatch):
    """The EPC method reload-skills reads the skills on a reading thread, as /reload does:
    compiling changed skills may take a while, and the loop serves other chats."""
    from opencortex.emacs import EmacsService
    where: list[int] = []
    real_reload = kernel.skills.reload
    monkeypatch.setattr(kernel.skills, "reload",
                        lambda: where.append(threading.get_ident()) or real_reload())

    async def scenario():
        loop_thread = threading.get_ident()
        answer = await EmacsService(kernel, None, None, 4096).reload_skills()
        return loop_thread, answer

    loop_thread, answer = run(scenario())
    assert where and where[0] != loop_thread
    assert answer == {"skills": len(kernel.skills.skills), "errors": []}
