"""The checkpoint `memory import` ends a long thread with, worked out by counting.

`checkpoint_threads` replayed each imported thread whole (`ThreadLog.load`) to
write it: 941 MB for one 400k-message chat.  `scan_checkpoint` pages through
the thread newest first and counts; what it writes must be exactly what the
replay gave, and a start after it must restore the same context.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from opencortex.conversation import checkpointscan
from opencortex.conversation.branches import CONTROL
from opencortex.conversation.checkpoint import CHECKPOINT, parse_checkpoint
from opencortex.conversation.checkpointscan import scan_checkpoint
from opencortex.conversation.conversations import WINDOW_MESSAGES, checkpoint_threads
from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory_commands import import_history
from test_summaries_stored import LOCAL, apply, checkpointed_turns, operations, view

CHAT = Thread("telegram", "4242")


def imported(thread: Thread, count: int, start: int = 0, first_role: str = "user"
             ) -> list[NewMessage]:
    """COUNT messages as `memory import` writes them ("auto" parents, their own times)."""
    other = "assistant" if first_role == "user" else "user"
    return [NewMessage(role=first_role if n % 2 == 0 else other, text=f"m{start + n}",
                       thread=thread, timestamp=1_600_000_000 + start + n,
                       extra={"IMPORTED": "jsonl", "TOKENS_OUT": str(n % 3)})
            for n in range(count)]


def replayed(archive: Archive, thread: Thread):
    """The checkpoint a whole replay gives (what `checkpoint_threads` wrote before)."""
    return parse_checkpoint(ThreadLog.load(archive, thread).checkpoint()[CHECKPOINT])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(talks=st.integers(0, 6), ops=operations,
       imports=st.lists(st.tuples(st.integers(0, 25), st.integers(0, 30),
                                  st.sampled_from(["user", "assistant"])), max_size=4),
       last=st.integers(0, 30), first_role=st.sampled_from(["user", "assistant"]))
def test_counting_gives_the_checkpoint_a_whole_replay_gives(talks, ops, imports, last,
                                                            first_role):
    """Turns, forks, pins, summaries, checkpoints, other writers, imports: whatever
    happened, a checkpoint worked out by counting is the replay's, and a thread
    whose branch changed since its last checkpoint is left to the replay."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.fsync", lambda fd: None)
        with Archive(Path(tmp) / "memory") as archive:
            log, others = ThreadLog.load(archive, LOCAL), []
            for counter, (op, n) in enumerate([("talk", 1)] * talks + ops):
                for at, count, role in imports:
                    if at == counter:
                        archive.append(imported(LOCAL, count, 100 * counter, role))
                apply(op, n, log, archive, counter * 10, others)
            archive.append(imported(LOCAL, last, 10_000, first_role))
            scanned = scan_checkpoint(archive, LOCAL)
            if scanned is None:
                event("left to the replay")
                return
            event("counted to the start" if scanned.exact else "counted to a checkpoint")
            whole = ThreadLog.load(archive, LOCAL)
            assert scanned.checkpoint == parse_checkpoint(whole.checkpoint()[CHECKPOINT])
            length = len(whole.entries())
            assert scanned.messages == length if scanned.exact else scanned.messages <= length


def test_an_import_is_checkpointed_without_reading_the_thread_whole(tmp_path, monkeypatch):
    """A new thread of 3,000 imported messages, and a live one (turns with their
    checkpoints, a pin, a summary, a strategy) that 2,500 more continue: each gets
    the checkpoint a replay gives, read a page at a time, and a start resumes both
    from the tail with the context a replay gives."""
    monkeypatch.setattr("os.fsync", lambda fd: None)
    source = tmp_path / "history.jsonl"
    source.write_text("".join(json.dumps(
        {"thread": str(CHAT), "role": "user" if n % 2 == 0 else "assistant",
         "sender": "alice" if n % 2 == 0 else None, "timestamp": 1_600_000_000 + n,
         "text": f"imported {n}"}) + "\n" for n in range(3000)))
    with Archive(tmp_path / "memory") as archive:
        live = ThreadLog.load(archive, LOCAL)
        checkpointed_turns(live, 30, pinned=3)
        live.set_strategy("galois")
        apply("summary", 0, live, archive, 99, [])
        apply("talk", 1, live, archive, 100, [])
        archive.append(imported(LOCAL, 2500))
        expected = {thread: replayed(archive, thread) for thread in (LOCAL,)}
        pages: list[int] = []
        reading = archive.records_before

        def paged(thread, before, limit):
            page = reading(thread, before, limit)
            pages.append(len(page))
            return page
        monkeypatch.setattr(archive, "records_before", paged)
        for whole in ("thread_records", "read_thread"):
            monkeypatch.setattr(archive, whole, lambda *args: pytest.fail("read whole"))
        monkeypatch.setattr(ThreadLog, "load", classmethod(lambda *a: pytest.fail("replayed")))
        report = import_history(archive, source)
        assert report.added == 3000 and checkpoint_threads(archive, [LOCAL]) == 1
        assert pages and max(pages) <= checkpointscan.PAGE
        monkeypatch.undo()
        for thread in (CHAT, LOCAL):
            records = archive.thread_records(thread)
            assert records[-1].extra[CONTROL] == "checkpoint"
            written = parse_checkpoint(records[-1].extra[CHECKPOINT])
            if thread in expected:
                assert written == expected[thread]
            loaded = ThreadLog.load(archive, thread)
            assert written.turns == loaded.turn_count() and written.head == loaded.head
            resumed = ThreadLog.resume(archive, thread, window=WINDOW_MESSAGES)
            assert resumed._partial
            assert view(resumed, WINDOW_MESSAGES) == view(loaded, WINDOW_MESSAGES)
        assert ThreadLog.load(archive, LOCAL).pins() and written.strategy == "galois"
        assert written.summary is not None


def test_a_branch_changed_since_the_last_checkpoint_is_left_to_the_replay(tmp_path,
                                                                          monkeypatch):
    """A fork and no turn since: counts cannot tell which branch the import continued,
    so the thread is opened as a start would (replayed whole) and still checkpointed."""
    monkeypatch.setattr("os.fsync", lambda fd: None)
    with Archive(tmp_path / "memory") as archive:
        log = ThreadLog.load(archive, LOCAL)
        checkpointed_turns(log, 5)
        log.fork(2)
        archive.append(imported(LOCAL, WINDOW_MESSAGES + 10))
        assert scan_checkpoint(archive, LOCAL) is None
        expected = replayed(archive, LOCAL)
        assert checkpoint_threads(archive, [LOCAL]) == 1
        written = archive.thread_records(LOCAL)[-1].extra[CHECKPOINT]
        assert parse_checkpoint(written) == expected
