"""Torn writes: a crash mid-write loses nothing, and only whole turns stay in the archive.

The write of one append is one unit (`:PART: k/N` on each entry): a file cut
at any byte of its last write is repaired by moving that whole write aside.
tests/test_archive_crash.py does the same with real SIGKILLs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from archive_helpers import LOCAL, entry_ends, make_record, say, torn_files
from opencortex.events import Thread
from opencortex.memory import Archive
from opencortex.memory import upkeep
from opencortex.memory.completeness import complete_length, last_entry_start, parse_thread_file
from opencortex.memory.orgformat import (EntryError, Part, parse_entry, read_entry, render_entry,
                                         render_header)
from opencortex.memory import threadfile
from opencortex.memory.threadfile import TAIL_CHUNK, locked, read_last_entry, settle_tail


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


def test_a_crash_at_any_byte_of_the_last_write_moves_the_whole_write_aside(archive):
    (first,) = archive.append([say("first")])
    path = archive.thread_file(LOCAL)
    before = path.stat().st_size
    archive.append([say("line one\n* two\n\nthree 🙂\n", role="assistant"),
                    say("déjà vu [2020-02-30 Sun]\r"),
                    say("esc \x1b[31m red", role="assistant")])
    full = path.read_bytes()
    ends = entry_ends(archive, LOCAL)
    assert len(ends) == 4 and ends[0] == before
    for cut in range(before + 1, len(full)):   # inside every entry and at each boundary
        path.write_bytes(full[:cut])
        assert archive.read_thread(LOCAL) == archive.thread_records(LOCAL) == [first]
        assert len(archive.repair()) == 1
        assert path.read_bytes() == full[:before]
        (fragment,) = torn_files(path)
        assert fragment.read_bytes() == full[before:cut]
        fragment.unlink()
        assert archive.history(LOCAL) == [first]
        assert archive.thread_records(LOCAL) == [first]
        assert archive.search("three") == archive.search("vu") == []
    path.write_bytes(full)
    assert archive.repair() == [] and len(archive.read_thread(LOCAL)) == 4


def test_an_incomplete_write_is_settled_by_the_next_append(archive):
    (first,) = archive.append([say("keep")])
    path = archive.thread_file(LOCAL)
    before = path.stat().st_size
    archive.append([say("question"), say("answer", role="assistant")])
    full = path.read_bytes()
    second_entry = entry_ends(archive, LOCAL)[1]
    for cut in (second_entry, second_entry + 1, len(full) - 1, before + 3):
        path.write_bytes(full[:cut])
        (after,) = archive.append([say("after")])
        assert after.parent == first.id
        assert archive.read_thread(LOCAL) == archive.thread_records(LOCAL) == [first, after]
        (fragment,) = torn_files(path)
        assert fragment.read_bytes() == full[before:cut]
        fragment.unlink()
        path.write_bytes(full[:before])
        archive.reindex()


def test_catching_up_with_another_process_skips_its_half_written_turn(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as reader, Archive(root) as writer:
        (first,) = writer.append([say("first")])
        assert reader.thread_records(LOCAL) == [first]
        path = writer.thread_file(LOCAL)
        before = path.stat().st_size
        turn = [make_record("question", parent=first.id), make_record("answer")]
        crashed = b"".join(render_entry(r, Part(k, 2)).encode("utf-8")
                           for k, r in enumerate(turn, 1))
        second_start = crashed.index(b"\n* ") + 1
        for cut in (second_start, len(crashed) - 1):   # whole entry 1/2; entry 2/2 torn
            with path.open("ab") as stream:             # a writer died mid-write
                stream.write(crashed[:cut])
            assert reader.thread_records(LOCAL) == [first]
            assert reader.search("question") == []
            (after,) = writer.append([say("after")])    # settles the tail, then writes
            assert after.parent == first.id
            assert reader.thread_records(LOCAL) == [first, after]
            path.write_bytes(path.read_bytes()[:before])
            reader.reindex()


def test_entries_of_one_write_carry_their_part():
    data = [render_entry(make_record(str(k)), Part(k, 3)).encode("utf-8") for k in (1, 2, 3)]
    assert [read_entry(entry).part for entry in data] == [Part(1, 3), Part(2, 3), Part(3, 3)]
    assert b"\n:PART:     2/3\n" in data[1]
    header = render_header(LOCAL).encode("utf-8")
    whole = header + b"".join(data)
    assert complete_length(whole) == len(whole)
    assert complete_length(whole[:-len(data[2])]) == 0     # entries 1/3 and 2/3: no whole write
    old = render_entry(make_record("before PART existed")).encode("utf-8")
    assert read_entry(old).part is None
    assert complete_length(header + old + data[0]) == len(header + old)
    for bad in ("0/2", "3/2", "1/", "a/b", "1/2/3", "-1/2", "1/2 x", "01/2"):
        entry = data[0].replace(b"PART:     1/3", b"PART:     " + bad.encode())
        with pytest.raises(EntryError, match="PART"):
            parse_entry(entry)


def test_parse_stops_before_an_incomplete_last_write():
    header = render_header(LOCAL).encode("utf-8")
    turn = [make_record("question"), make_record("answer")]
    first = b"".join(render_entry(r, Part(k, 2)).encode("utf-8") for k, r in enumerate(turn, 1))
    second = [make_record("again"), make_record("torn")]
    chunks = [render_entry(r, Part(k, 2)).encode("utf-8") for k, r in enumerate(second, 1)]
    data = header + first + chunks[0] + chunks[1][:-5]
    parsed = parse_thread_file(data)
    assert [r for _, r in parsed.entries] == turn
    assert parsed.length == len(header + first)
    tail = parse_thread_file(first + chunks[0], base=len(header))
    assert [r for _, r in tail.entries] == turn and tail.length == len(first)


def test_a_crash_inside_the_first_write_leaves_an_empty_file(archive):
    archive.append([say("only")])
    path = archive.thread_file(LOCAL)
    full = path.read_bytes()
    for cut in range(1, len(full)):
        path.write_bytes(full[:cut])
        assert archive.read_thread(LOCAL) == []
        assert len(archive.repair()) == 1
        assert path.read_bytes() == b"" and torn_files(path)[0].read_bytes() == full[:cut]
        torn_files(path)[0].unlink()
    assert archive.threads() == []
    (again,) = archive.append([say("again")])
    assert archive.read_thread(LOCAL) == [again] and again.parent is None


def test_append_moves_a_torn_tail_aside_before_writing(archive):
    (first,) = archive.append([say("keep")])
    archive.append([say("torn")])
    path = archive.thread_file(LOCAL)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    (third,) = archive.append([say("after")])
    assert third.parent == first.id
    assert archive.read_thread(LOCAL) == [first, third]
    assert len(torn_files(path)) == 1


def test_the_tail_this_process_wrote_is_trusted_by_its_bytes_alone(archive, monkeypatch):
    """The next append to a file that still ends with the entry last written there does
    not read its tail again; one whose last entry changed, even in place at the same
    size (and so within one tick of the file clock), is settled from the file."""
    settled = []
    monkeypatch.setattr(threadfile, "settle_tail",
                        lambda *args: settled.append(args[1]) or settle_tail(*args))
    (first,) = archive.append([say("one")])                     # a file new to it: read
    path = archive.thread_file(LOCAL)
    (second,) = archive.append([say("two")])
    assert settled == [path] and second.parent == first.id      # known: not read again
    data = path.read_bytes()
    changed = data[:data.rindex(b"two")] + b"owt" + data[data.rindex(b"two") + 3:]
    with open(path, "r+b") as stream:                    # same size, same inode
        stream.write(changed)
    (third,) = archive.append([say("three")])
    assert settled == [path] * 2 and third.parent == second.id  # read, and still whole
    assert [r.text for r in archive.read_thread(LOCAL)] == ["one", "owt", "three"]
    path.write_bytes(path.read_bytes()[:-3])                    # torn: moved aside
    (fourth,) = archive.append([say("four")])
    assert fourth.parent == second.id and len(torn_files(path)) == 1


def test_opening_repairs_torn_tails(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        (kept,) = archive.append([say("kept")])
        archive.append([say("torn")])
        path = archive.thread_file(LOCAL)
    path.write_bytes(path.read_bytes()[:-10])
    with Archive(root) as reopened:
        assert reopened.read_thread(LOCAL) == [kept]
        assert reopened.history(LOCAL) == [kept]
        assert len(torn_files(path)) == 1


def test_hidden_files_and_directories_are_no_thread_files(tmp_path):
    """The index and the list of threads agree on what a thread file is: a hidden
    copy (".old.org", a ".backup" directory) is neither indexed nor listed."""
    root = tmp_path / "memory"
    with Archive(root) as archive:
        archive.append([say("only once")])
        path = archive.thread_file(LOCAL)
    (path.parent / ".old.org").write_bytes(path.read_bytes())
    (root / ".backup").mkdir()
    (root / ".backup" / path.name).write_bytes(path.read_bytes())
    with Archive(root) as reopened:
        assert reopened.reindex() == 1
        assert [hit.text for hit in reopened.search("once")] == ["only once"]
        assert reopened.threads() == [LOCAL]


def test_opening_opens_only_the_files_the_index_has_not_seen_at_their_size(
        tmp_path, monkeypatch):
    """A start stats each thread file and opens none the index has seen whole (it used
    to open and lock every file twice: 0.16 s for 2,000 threads); a file torn
    meanwhile, or new to the index, is still opened, repaired and indexed."""
    root = tmp_path / "memory"
    threads = [Thread("emacs", f"t{i}") for i in range(12)]
    with Archive(root) as archive:
        for thread in threads:
            archive.append([say(f"hello {thread.chat_id}", thread)])
        (kept,) = archive.append([say("kept", threads[7])])
        archive.append([say("torn", threads[7])])
        torn, other = archive.thread_file(threads[7]), archive.thread_file(threads[3])
    opened = []
    real_locked = upkeep.locked
    monkeypatch.setattr(upkeep, "locked",
                        lambda path, **kw: opened.append(path) or real_locked(path, **kw))
    with Archive(root):
        assert opened == []
    torn.write_bytes(torn.read_bytes()[:-10])
    (root / "index.sqlite").unlink()        # ... and one the index has not seen: all of them
    with Archive(root) as reopened:
        assert set(opened) == {reopened.thread_file(t) for t in threads}
    opened.clear()
    other.write_bytes(other.read_bytes() + b"* torn")
    with Archive(root) as reopened:
        assert set(opened) == {other}
        assert reopened.read_thread(threads[7])[-1] == kept
        assert [m.text for m in reopened.history(threads[3])] == ["hello t3"]
        assert len(torn_files(torn)) == 1 and len(torn_files(other)) == 1


def test_two_processes_appending_to_one_file_keep_a_single_chain(tmp_path):
    root = tmp_path / "memory"
    Archive(root).close()
    script = textwrap.dedent(f"""
        import sys
        from opencortex.events import Thread
        from opencortex.memory import Archive, NewMessage
        with Archive({str(root)!r}) as archive:
            for i in range(25):
                archive.append([NewMessage(role="user", text=f"{{sys.argv[1]}} {{i}}\\nmore",
                                           thread=Thread("cli", "local"))])
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script, name]) for name in "AB"]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    with Archive(root) as archive:
        records = archive.read_thread(LOCAL)
        assert len(records) == 50
        assert [r.parent for r in records] == [None] + [r.id for r in records[:-1]]
        assert archive.history(LOCAL, limit=50) == records
        assert sorted(r.text for r in records) == sorted(
            f"{n} {i}\nmore" for n in "AB" for i in range(25))


@pytest.mark.parametrize("size", [1, 2, TAIL_CHUNK - 1, TAIL_CHUNK, TAIL_CHUNK + 1,
                                  3 * TAIL_CHUNK + 5])
def test_the_last_entry_is_found_across_read_chunks(tmp_path, size):
    path = tmp_path / "file.org"
    for mark in sorted({0, 1, size - TAIL_CHUNK - 1, size - TAIL_CHUNK, size - 2, size // 2}):
        data = bytearray(b"x" * size)
        if 0 <= mark <= size - 2:
            data[mark:mark + 2] = b"\n*"
        for leading_star in (False, True):
            if leading_star:
                data[0:1] = b"*"
            path.write_bytes(data)
            with locked(path, exclusive=False) as fd:
                start, tail = read_last_entry(fd, size)
            expected = last_entry_start(bytes(data))
            assert start == expected
            assert tail == (bytes(data) if expected is None else bytes(data[expected:]))


def test_complete_length_of_header_only_and_empty_files():
    header = render_header(LOCAL).encode("utf-8")
    entry = render_entry(make_record("x")).encode("utf-8")
    assert complete_length(b"") == 0
    assert complete_length(header) == 0
    assert complete_length(header + entry) == len(header + entry)
    assert complete_length(header + entry + entry[:-1]) == len(header + entry)
    with pytest.raises(EntryError):
        parse_entry(entry[:-1])
