"""A thread file changed other than by appending (edited by hand) is read again from
its start a chunk at a time, in the background, without dropping its rows first:
the archive opens at once, searches meanwhile see each message as it is or as it
was, and the index ends up as a rebuild would make it (see `memory.reread`)."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time

import pytest

from archive_helpers import say
from opencortex.events import Thread
from opencortex.memory import Archive
from opencortex.memory import reread, threadfile, upkeep
from opencortex.memory.partitions import fts_tables
from opencortex.memory.threadfile import entry_id_at, locked

THREAD, OTHER = Thread("emacs", "long"), Thread("emacs", "short")
WAIT = 30.0            # seconds any wait of these tests lasts at most


def index_of(archive: Archive) -> tuple[list, list]:
    """What the index holds: every row (all columns but its number) in file order, and
    every searchable text by message id."""
    db = archive._index._db
    rows = db.execute("SELECT id, role, text, channel, chat_id, sender, epoch, parent, "
                      "turn_type, extra, file, offset FROM messages ORDER BY file, offset")
    texts = sorted(row for table in fts_tables(db) for row in db.execute(
        f"SELECT m.id, f.text FROM {table} f LEFT JOIN messages m ON m.seq = f.rowid"))
    return rows.fetchall(), texts


def rebuilt(archive: Archive) -> tuple[list, list]:
    """What a rebuild from the org files makes of the index."""
    archive.reindex()
    return index_of(archive)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An archive with a thread of 30 turns (a long message in turn 7, written in one
    go; each reply with a NOTE, as a checkpoint) and a short one; chunks of a few hundred
    bytes, none indexed before opening."""
    monkeypatch.setattr(upkeep, "INLINE_BYTES", 0)
    monkeypatch.setattr(upkeep, "CHUNK_BYTES", 700)
    monkeypatch.setattr(reread, "SWEEP_ROWS", 7)
    root = tmp_path / "memory"
    with Archive(root) as archive:
        for turn in range(30):
            archive.append([say(f"question {turn} about the walrus", THREAD),
                            say(f"answer {turn} teh end" + " y" * 900 * (turn == 7), THREAD,
                                role="assistant", extra={"NOTE": f"turn {turn} of 30"})])
        archive.append([say("unrelated", OTHER)])
    return root


def edit(archive_or_root, change) -> None:
    """Apply CHANGE (bytes -> bytes) to THREAD's file, as an editor would (saved at a
    later time, even where the file system's clock is coarse)."""
    root = archive_or_root.root if isinstance(archive_or_root, Archive) else archive_or_root
    path = Archive(root, read_only=True).thread_file(THREAD)
    before = path.stat().st_mtime_ns
    path.write_bytes(change(path.read_bytes()))
    if path.stat().st_mtime_ns <= before:
        os.utime(path, ns=(before + 10**6, before + 10**6))


def chunks(monkeypatch, allowed: int | None = None) -> tuple[list, threading.Event]:
    """Record every background chunk (its file), holding each after the first ALLOWED
    until the event is set."""
    done, gate = [], threading.Event()
    chunk = Archive._catch_up_chunk

    def counted(self, path):
        if allowed is not None and len(done) >= allowed:
            assert gate.wait(WAIT)
        done.append(path.name)
        return chunk(self, path)
    monkeypatch.setattr(Archive, "_catch_up_chunk", counted)
    return done, gate


def until(condition) -> None:
    """Wait for CONDITION() to hold (at most WAIT seconds)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def fix_typo(data: bytes) -> bytes:
    """One message corrected (the file grows 1 byte)."""
    return data.replace(b"answer 12 teh end", b"answer 12 the end!")


def swap_letters(data: bytes) -> bytes:
    """One message corrected, the file keeping its size (only its time tells)."""
    return data.replace(b"answer 12 teh end", b"answer 12 the end")


def drop_property(data: bytes) -> bytes:
    """Every reply loses its NOTE line (the file shrinks by hundreds of bytes)."""
    return re.sub(rb"(?m)^:NOTE: .*\n", b"", data)


def remove_turn(data: bytes) -> bytes:
    """The entries of turn 3 are cut out."""
    start = data.index(b"* user", data.index(b"answer 2 teh"))
    return data[:start] + data[data.index(b"* user", start + 10):]


def copy_entry(data: bytes) -> bytes:
    """The first entry is copied after the fifth (its id twice in the file)."""
    starts = [i + 1 for i in range(len(data)) if data[i:i + 2] == b"\n*"]
    return data[:starts[5]] + data[starts[0]:starts[1]] + data[starts[5]:]


@pytest.mark.parametrize("change", [fix_typo, swap_letters, drop_property, remove_turn,
                                    copy_entry])
def test_an_edited_file_is_read_again_in_chunks_to_what_a_rebuild_makes(home, monkeypatch,
                                                                        change):
    with Archive(home) as archive:
        archive.wait_indexed(WAIT)
        edit(archive, change)
    done, _ = chunks(monkeypatch)
    with Archive(home, background=True) as archive:
        assert archive.wait_indexed(WAIT)
        assert archive._index.rereads() == {}
        now = index_of(archive)
        assert now == rebuilt(archive)
    assert done.count("long.org") > 10          # chunks, not the whole file at once


def test_the_archive_opens_without_reading_the_edited_file(home, monkeypatch):
    """A hand edit that grows a file 1 byte has the whole file read again: that is not
    "1 byte behind", done before the archive opens, but work for the background."""
    with Archive(home):
        pass
    edit(home, fix_typo)
    size = (home / "emacs" / "long.org").stat().st_size
    monkeypatch.setattr(upkeep, "INLINE_BYTES", size // 2)
    monkeypatch.setattr(threadfile, "TAIL_CHUNK", 256)     # the tail is read backwards
    read = []
    original = threadfile.read_range
    monkeypatch.setattr(threadfile, "read_range",
                        lambda fd, start, end: read.append(end - start) or original(fd, start, end))
    done, gate = chunks(monkeypatch, allowed=0)
    with Archive(home, background=True) as archive:
        assert "indexing the org files in the background" in archive.index_report()
        assert sum(read) < 2000                # settling the tail: its last entry
        gate.set()
        assert archive.wait_indexed(WAIT)
    assert done and max(read) < 4 * 1000       # each chunk reads about a write or two


def test_searches_meanwhile_see_each_message_as_it_is_or_as_it_was(home, monkeypatch):
    with Archive(home) as archive:
        archive.wait_indexed(WAIT)
        first = archive.search("question", limit=100)
    edit(home, lambda data: fix_typo(remove_turn(data)))
    done, gate = chunks(monkeypatch, allowed=3)
    with Archive(home, background=True) as archive:
        until(lambda: len(done) == 3)
        with archive.lock:                     # the third chunk is over
            assert archive._index.reread_of("emacs/long.org").offset > 0
        # not read yet: the old text and the removed turn are still found, once each
        assert [h.text for h in archive.search("teh", threads=[THREAD], limit=100)
                if h.text.startswith("answer 12 ")] == ["answer 12 teh end"]
        hits = archive.search("question", limit=100)
        assert len({h.id for h in hits}) == len(hits) == len(first)
        [new] = archive.append([say("a question asked meanwhile", THREAD)])
        assert [h.id for h in archive.search("meanwhile")] == [new.id]
        gate.set()
        assert archive.wait_indexed(WAIT)
        assert archive.search("teh", threads=[THREAD], limit=100) != []        # other turns
        assert not [h for h in archive.search("teh", limit=100) if "answer 12" in h.text]
        assert [h.text for h in archive.search("question 3 ", limit=100)
                if h.text == "question 3 about the walrus"] == []
        assert len(archive.search("question", limit=100)) == len(first)   # -1 turn, +1 new
        assert archive.history(THREAD, 100) == archive.read_thread(THREAD)
        assert index_of(archive) == rebuilt(archive)


def test_a_stop_mid_way_loses_nothing_and_the_next_start_goes_on(home, monkeypatch):
    """A one-shot command stops the re-read when it ends: how far it got is kept in the
    index, and the next start goes on from there (not from the start again)."""
    with Archive(home) as archive:
        archive.wait_indexed(WAIT)
    edit(home, drop_property)
    done, gate = chunks(monkeypatch, allowed=5)
    archive = Archive(home, background=True)
    until(lambda: len(done) == 5)
    threading.Timer(0.2, gate.set).start()
    archive.close()
    monkeypatch.undo()
    with Archive(home, read_only=True) as reader:          # a rebuild, for comparison
        expected = index_of(reader)
    starts = []
    original = threadfile.parse_writes
    monkeypatch.setattr(reread, "parse_writes", lambda fd, start, size, limit: (
        starts.append(start), original(fd, start, size, limit))[1])
    with Archive(home) as reopened:
        assert starts and starts[0] > 0          # went on from where it was stopped
        assert reopened._index.rereads() == {}
        rows, texts = index_of(reopened)
    assert [row[:-2] + row[-1:] for row in rows] == [row[:-2] + row[-1:] for row in expected[0]]
    assert texts == expected[1]


def test_a_file_replaced_while_read_again_is_read_from_its_start(home, monkeypatch):
    with Archive(home) as archive:
        archive.wait_indexed(WAIT)
    edit(home, fix_typo)
    done, gate = chunks(monkeypatch, allowed=4)
    with Archive(home, background=True) as archive:
        until(lambda: len(done) == 4)
        with archive.lock:
            path = archive.thread_file(THREAD)
            replacement = path.with_suffix(".new")
            replacement.write_bytes(remove_turn(path.read_bytes()))
            os.replace(replacement, path)
        gate.set()
        assert archive.wait_indexed(WAIT)
        assert index_of(archive) == rebuilt(archive)


def test_a_thread_opened_meanwhile_is_read_again_whole_at_once(home, monkeypatch):
    with Archive(home) as archive:
        archive.wait_indexed(WAIT)
    edit(home, lambda data: fix_typo(copy_entry(data)))
    done, gate = chunks(monkeypatch, allowed=2)
    with Archive(home, background=True) as archive:
        until(lambda: len(done) == 2)
        assert archive.thread_records(THREAD) == archive.read_thread(THREAD)[:5] + \
            archive.read_thread(THREAD)[6:]             # the copy of an id is passed over
        assert archive._index.reread_of("emacs/long.org") is None
        gate.set()
        assert archive.wait_indexed(WAIT)
        assert index_of(archive) == rebuilt(archive)


def test_the_id_of_the_entry_at_an_offset_is_read_from_its_drawer(tmp_path):
    path = tmp_path / "t.org"
    long = ":ZZ: " + "p" * 5000 + "\n"
    path.write_text("#+TITLE: t\n\n* user [x]\n:PROPERTIES:\n:ROLE: user\n" + long +
                    ":ID: abc\n:END:\n:ID: body\n* a [y]\n:PROPERTIES:\n:END:\n:ID: nope\n")
    data = path.read_bytes()
    with locked(path, exclusive=False) as fd:
        assert entry_id_at(fd, data.index(b"* user")) == "abc"
        assert entry_id_at(fd, data.index(b"* a [y]")) is None        # a body line is no id
        assert entry_id_at(fd, data.index(b":ROLE")) is None           # no entry begins there
        assert entry_id_at(fd, 0) is None and entry_id_at(fd, len(data)) is None


def test_an_edit_that_keeps_the_size_is_seen_by_a_running_archive(home):
    with Archive(home) as archive:
        assert archive.search("teh")
        edit(archive, swap_letters)
        texts = [record.text for record in archive.thread_records(THREAD)]
        assert "answer 12 the end" in texts and "answer 12 teh end" not in texts
        assert [hit.text for hit in archive.search("answer 12 the end")][:1] == \
            ["answer 12 the end"]
        assert archive._index.rereads() == {}
        assert index_of(archive) == rebuilt(archive)


def test_a_file_only_touched_is_read_again_and_changes_nothing(home):
    with Archive(home) as archive:
        before = index_of(archive)
    path = home / "emacs" / "long.org"
    later = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(later, later))
    with Archive(home) as archive:
        assert index_of(archive) == before
        assert archive._index.file_state("emacs/long.org")[1] == later


def test_an_index_of_layout_5_is_upgraded_in_place_and_then_sees_same_size_edits(home):
    """Layout 5 had no modification times: they are added as unknown (the files are not
    read again), and the next write of a file records its time; the index on time,
    made then only for imports, is made."""
    with Archive(home) as archive:
        seqs = dict(archive._index._db.execute("SELECT id, seq FROM messages"))
    db = sqlite3.connect(home / "index.sqlite")
    db.execute("ALTER TABLE files DROP COLUMN mtime")
    db.execute("DROP INDEX messages_in_time")       # layout 5 made it only for imports
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    with Archive(home) as archive:
        assert dict(archive._index._db.execute("SELECT id, seq FROM messages")) == seqs
        assert {mtime for _, mtime in archive._index.file_states().values()} == {0}
        assert archive._index._db.execute("SELECT 1 FROM sqlite_master WHERE name = "
                                          "'messages_in_time'").fetchone()
        archive.append([say("one more question", THREAD)])
        assert archive._index.file_state("emacs/long.org")[1] != 0
    edit(home, swap_letters)
    with Archive(home) as archive:
        assert "answer 12 the end" in [r.text for r in archive.thread_records(THREAD)]
