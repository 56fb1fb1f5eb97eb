"""An index far behind the org files is caught up in the background by a long-lived
kernel's archive: it opens at once, turns are written and indexed meanwhile, and the
index ends up as a rebuild would make it (see `memory.upkeep`)."""

from __future__ import annotations

import os
import threading

import pytest

from archive_helpers import say
from opencortex.config import load_config
from opencortex.events import Thread, chat_message
from opencortex.runtime import build_kernel
from opencortex.memory import Archive
from opencortex.memory import ranking, threadfile, upkeep

THREADS = [Thread("emacs", f"t{i}") for i in range(6)]
WAIT = 30.0            # seconds any wait of these tests lasts at most


def rows(archive: Archive) -> list[tuple]:
    """What the index holds: each message's id, file and place, in order."""
    return archive._index._db.execute(
        "SELECT id, file, offset FROM messages ORDER BY file, offset").fetchall()


@pytest.fixture
def behind(tmp_path, monkeypatch):
    """An archive of 6 threads whose index was lost; catch-up always in the background,
    a few hundred bytes per chunk."""
    monkeypatch.setattr(upkeep, "INLINE_BYTES", 0)
    monkeypatch.setattr(upkeep, "CHUNK_BYTES", 600)
    root = tmp_path / "memory"
    with Archive(root) as archive:
        for number, thread in enumerate(THREADS):
            for turn in range(8):
                archive.append([say(f"walrus note {number}.{turn}", thread),
                                say(f"reply {number}.{turn} " + "x" * 900 * (turn == 3), thread,
                                    role="assistant")])
        whole = rows(archive)
    for suffix in ("", "-wal", "-shm"):
        (root / f"index.sqlite{suffix}").unlink(missing_ok=True)
    return root, whole


def gated(monkeypatch) -> threading.Event:
    """Hold every background chunk until the event is set."""
    gate = threading.Event()
    chunk = Archive._catch_up_chunk

    def held(self, path):
        assert gate.wait(WAIT)
        return chunk(self, path)
    monkeypatch.setattr(Archive, "_catch_up_chunk", held)
    return gate


def test_an_archive_opens_at_once_and_is_indexed_while_in_use(behind, monkeypatch):
    root, whole = behind
    gate = gated(monkeypatch)
    with Archive(root, background=True) as archive:
        assert "indexing the org files in the background: 0 of 6" in archive.index_report()
        assert archive.search("walrus") == []                 # nothing indexed yet
        [new] = archive.append([say("a walrus joined late", THREADS[2])])
        assert [h.id for h in archive.search("late")] == [new.id]
        assert len(archive.thread_records(THREADS[4])) == 16   # opened: caught up whole
        gate.set()
        assert archive.wait_indexed(WAIT)
        assert archive.index_report() == "up to date with the org files"
        assert len(archive.search("walrus", limit=100)) == 49
        now = rows(archive)
        assert len(now) == len(whole) + 1 and set(whole) <= set(now)
        for thread in THREADS:
            assert archive.history(thread, limit=100) == archive.read_thread(thread)


def test_a_chunk_at_a_time_indexes_what_a_rebuild_does(behind):
    """Chunks end at whole writes; a write longer than a chunk (the 900 x) is read whole."""
    root, whole = behind
    with Archive(root, background=True) as archive:
        assert archive.wait_indexed(WAIT)
        assert rows(archive) == whole
        archive.reindex()
        assert rows(archive) == whole


def test_closing_stops_the_catch_up_and_the_next_open_finishes_it(behind, monkeypatch):
    root, whole = behind
    gate = gated(monkeypatch)
    archive = Archive(root, background=True)
    threading.Timer(0.2, gate.set).start()       # the chunk under way when closing ends
    archive.close()
    monkeypatch.undo()
    with Archive(root) as reopened:              # a command: caught up before it opens
        assert rows(reopened) == whole
        assert reopened.index_report() == "up to date with the org files"


def test_little_to_index_is_indexed_before_the_archive_opens(behind, monkeypatch):
    root, whole = behind
    monkeypatch.setattr(upkeep, "INLINE_BYTES", 1 << 20)
    with Archive(root, background=True) as archive:
        assert archive.index_report() == "up to date with the org files"
        assert rows(archive) == whole


def test_writes_longer_than_a_chunk_are_a_chunk_each_never_the_rest_of_the_file(
        tmp_path, monkeypatch):
    """An import writes 1,000 messages at once (390 KB, over CHUNK_BYTES): such a write is
    a chunk of its own, read by doubling, while the chunk used to become the whole rest
    of the file (one hold of the lock: 14 s for 100k messages)."""
    monkeypatch.setattr(upkeep, "INLINE_BYTES", 0)
    monkeypatch.setattr(upkeep, "CHUNK_BYTES", 600)
    root = tmp_path / "memory"
    with Archive(root) as archive:
        for write in range(12):
            archive.append([say(f"imported {write}.{n} walrus", THREADS[0]) for n in range(20)])
        whole, size = rows(archive), archive.thread_file(THREADS[0]).stat().st_size
    (root / "index.sqlite").unlink()
    monkeypatch.setattr(threadfile, "TAIL_CHUNK", 256)      # settling reads the tail back
    read, parsed = [], []
    original, parse = threadfile.read_range, upkeep.parse_writes
    monkeypatch.setattr(threadfile, "read_range", lambda fd, start, end: (
        read.append(end - start), original(fd, start, end))[1])

    def parse_counted(*args):
        found = parse(*args)
        parsed.append(found.length)
        return found
    monkeypatch.setattr(upkeep, "parse_writes", parse_counted)
    with Archive(root, background=True) as archive:
        assert archive.wait_indexed(WAIT)
        assert rows(archive) == whole
    write = size // 12
    assert len(parsed) >= 12 and max(parsed) < 2 * write       # one write per chunk
    assert max(read) < 2 * 2 * write < size / 2                # read by doubling, no more


@pytest.mark.parametrize("background", [False, True])
def test_the_thread_written_last_is_indexed_last(tmp_path, monkeypatch, background):
    """Rows are numbered as they come and "the newest matches" of a search of common
    words are the highest numbers: a rebuild indexes the file written last, last (by
    name order, a chat of last year named "zoo" came before today's "alpha")."""
    monkeypatch.setattr(ranking, "COMMON_DOCS", 3)
    monkeypatch.setattr(upkeep, "INLINE_BYTES", 0)
    root = tmp_path / "memory"
    today, last_year = Thread("emacs", "alpha"), Thread("emacs", "zoo")
    with Archive(root) as archive:
        for thread, said in ((last_year, "old"), (today, "new")):
            archive.append([say(f"the {said} report {i}", thread) for i in range(4)])
        written = {archive.thread_file(last_year): 10**18, archive.thread_file(today): 2 * 10**18}
    for path, when in written.items():
        os.utime(path, ns=(when, when))
    (root / "index.sqlite").unlink()
    with Archive(root, background=background) as archive:
        assert archive.wait_indexed(WAIT)
        assert [h.text for h in archive.search("the", limit=2)] == [
            "the new report 3", "the new report 2"]


def test_an_indexed_size_off_a_write_boundary_is_read_again_and_ends(behind):
    """A file whose indexed size does not end a write (edited by hand, say) is read
    again from its start, a chunk at a time (how far is kept: see `reread`), and ends."""
    root, whole = behind
    with Archive(root) as archive:
        name = archive._name(archive.thread_file(THREADS[1]))
        archive._index.set_file_size(name, 1234)
    with Archive(root, background=True) as archive:
        assert archive.wait_indexed(WAIT)
        assert rows(archive) == whole


def test_a_kernel_answers_and_recalls_while_its_index_is_caught_up(behind, monkeypatch):
    """The long-lived kernel opens its archive in the background: a turn is answered
    before the catch-up has done anything, and /metrics says how far the index is."""
    import asyncio
    root, whole = behind
    gate = gated(monkeypatch)
    kernel = build_kernel(load_config(root.parent), writer=lambda text: None)
    try:
        metrics = asyncio.run(kernel.run_command(THREADS[0], "/metrics"))
        assert "indexing the org files in the background: 0 of 6" in metrics
        result = asyncio.run(kernel.handle(chat_message("the walrus note?", "cli", "t0")))
        assert result.status == "done" and result.text == "[Echo] the walrus note?"
        gate.set()
        assert kernel.archive.wait_indexed(WAIT)
        assert "index: up to date with the org files" in asyncio.run(
            kernel.run_command(THREADS[0], "/metrics"))
        assert len(rows(kernel.archive)) == len(whole) + 2
    finally:
        gate.set()
        asyncio.run(kernel.aclose())


def test_a_read_only_archive_of_a_home_without_memory_is_empty(tmp_path):
    """A home that cannot be written may have no memory directory yet: nothing to read."""
    with Archive(tmp_path / "no-memory-yet", read_only=True) as archive:
        assert archive.search("anything") == [] and archive.threads() == []
        assert archive.index_report() == "up to date with the org files"
