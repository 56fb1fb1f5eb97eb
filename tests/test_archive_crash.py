"""SIGKILL a writer at any moment: every turn is stored whole or not at all.

A writer process (tests/archive_crash_writer.py) appends turns of 2-3 large
messages through `Archive.append` and acknowledges each one after append
returns.  It is killed KILLS times: half the kills after a seeded random
delay (any moment: opening, settling, rendering, writing, fsync, indexing),
half aimed at a write (as soon as a thread file is seen growing, so most of
those land inside the one `os.write` of a turn).  After every kill, a reader
must not see half a turn, and after repair (by opening the archive, or by the
next append of a live process) every file holds whole writes only, every
acknowledged message is there exactly once, the index agrees, and what was
moved aside is in the `.torn-` files.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orgparse

from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory.completeness import HEADING_START, parse_thread_file
from opencortex.memory.orgformat import Part, read_entry

KILLS = 50                # SIGKILLs in all, spread over ARCHIVES archives
ARCHIVES = 10
MAX_EXTRA_ARCHIVES = 10   # more rounds, only while no kill has landed inside a write
SEED = 20261123
WRITER = Path(__file__).with_name("archive_crash_writer.py")
THREADS = (Thread("cli", "crash-a"), Thread("cli", "crash-b"))
LINE_WAIT = 60.0          # seconds to wait for one line of the writer before giving up
MAX_RANDOM_DELAY = 0.02   # seconds: the latest a random kill comes after the writer started
MAX_AIM_POLLS = 2_000_000  # file size checks while waiting to see a write in progress


class WriterServer:
    """The writer's fork server; its output lines are read on a thread into a queue."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(WRITER)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1,
                                        start_new_session=True)
        self.writer: int | None = None       # pid of the writer started and not yet ended
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("eof")

    def line(self) -> str:
        """The next output line (fails the test instead of hanging when none comes)."""
        try:
            return self.lines.get(timeout=LINE_WAIT)
        except queue.Empty:
            raise AssertionError("the writer went silent") from None

    def start_writer(self, root: Path, seed: int) -> int:
        """Fork a writer on ROOT; returns its pid."""
        self.process.stdin.write(f"write {root} {seed}\n")
        self.process.stdin.flush()
        word, pid = self.line().split()
        assert word == "started"
        self.writer = int(pid)
        return self.writer

    def wait_ended(self, pid: int, acks: list[list[str]]) -> int:
        """Collect acknowledgements into ACKS until the writer PID ended; its wait status."""
        for _ in range(100_000):
            word, *rest = self.line().split()
            if word == "ack":
                acks.append(rest)
            elif word == "ended":
                assert int(rest[0]) == pid
                self.writer = None
                return int(rest[1])
            else:
                raise AssertionError(f"unexpected writer output {word!r}")
        raise AssertionError("the writer printed too many lines")

    def close(self) -> None:
        """End the server (it exits at end of input) and reap it.

        A writer still running (a check failed before its kill) is killed with
        the server: they are alone in their own process group.
        """
        if self.writer is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.stdin.close()
        try:
            self.process.wait(timeout=LINE_WAIT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()
            self.reader.join(timeout=LINE_WAIT)


def file_sizes(paths: list[Path]) -> list[int]:
    return [path.stat().st_size if path.exists() else 0 for path in paths]


def kill_at_random(pid: int, rng: random.Random) -> None:
    """SIGKILL the writer after a random delay from its start."""
    time.sleep(rng.uniform(0, MAX_RANDOM_DELAY))
    os.kill(pid, signal.SIGKILL)


def kill_in_a_write(server: WriterServer, pid: int, turns: int, acks: list,
                    paths: list[Path]) -> None:
    """Let TURNS turns complete, then SIGKILL the writer as soon as a file is seen growing."""
    for _ in range(turns):
        word, *rest = server.line().split()
        assert word == "ack", word
        acks.append(rest)
    base = file_sizes(paths)
    for _ in range(MAX_AIM_POLLS):
        if any(now > before for now, before in zip(file_sizes(paths), base)):
            break
    os.kill(pid, signal.SIGKILL)


def whole_writes(parts: list[Part | None]) -> bool:
    """True when PARTS split into whole writes: 1/N, 2/N, ..., N/N (None: a write of one)."""
    expected = None          # the Part the open write needs next; None between writes
    for part in parts:
        if part != expected and (expected is not None or part is not None and part.number != 1):
            return False
        done = part is None or part.number == part.total
        expected = None if done else Part(part.number + 1, part.total)
    return expected is None


def strict_entries(data: bytes, length: int) -> list:
    """Every entry of DATA[:LENGTH], strictly parsed (fails on a torn or half entry)."""
    starts = [m.start() for m in HEADING_START.finditer(data, 0, length)] + [length]
    return [read_entry(data[start:end]) for start, end in zip(starts, starts[1:])]


def check_reader_view(live: Archive, paths: list[Path], acked: set[str]) -> dict[Path, bytes]:
    """Before any repair: a reader (parsing the file, or catching its index up with it)
    sees whole writes only, and every acknowledged message.

    Returns each file's bytes beyond its complete part (what repair must move aside).
    """
    seen, tails = [], {}
    for thread, path in zip(THREADS, paths):
        if not path.exists():
            continue
        data = path.read_bytes()
        parsed = parse_thread_file(data)
        entries = strict_entries(data, parsed.length)
        assert [e.record for e in entries] == [record for _, record in parsed.entries]
        assert live.thread_records(thread) == [e.record for e in entries]
        assert whole_writes([e.part for e in entries])
        seen += [e.record.id for e in entries]
        tails[path] = data[parsed.length:]
    assert acked <= set(seen)
    return tails


def check_repaired(archive: Archive, paths: list[Path], acked: set[str],
                   tails: dict[Path, bytes], torn_seen: dict[Path, set[Path]]) -> int:
    """After repair: whole writes only, acknowledged ids once, index agrees, tails kept.

    Returns how many incomplete writes were moved aside in this round.
    """
    ids, moved = Counter(), 0
    for thread, path in zip(THREADS, paths):
        if not path.exists():
            continue
        data = path.read_bytes()
        entries = strict_entries(data, len(data))     # every entry whole, up to the end
        assert whole_writes([e.part for e in entries])
        nodes = orgparse.load(str(path))[1:]
        assert [node.properties["ID"] for node in nodes] == [e.record.id for e in entries]
        records = [e.record for e in entries]
        assert archive.thread_records(thread) == records
        ids.update(record.id for record in records)
        new_torn = set(path.parent.glob(path.name + ".torn-*")) - torn_seen[path]
        torn_seen[path] |= new_torn
        if tails.get(path):
            (fragment,) = new_torn
            assert fragment.read_bytes() == tails[path]
            moved += 1
        else:
            assert not new_torn
    assert all(ids[message_id] == 1 for message_id in acked)
    assert all(count == 1 for count in ids.values())
    return moved


def settle_by_appending(archive: Archive, acked: set[str]) -> None:
    """A live process appends to every thread: its append settles the torn tails."""
    for thread in THREADS:
        (record,) = archive.append([NewMessage(role="system", text="settled", thread=thread)])
        acked.add(record.id)


def kill_rounds(server: WriterServer, root: Path, rng: random.Random, rounds: int) -> int:
    """Kill a writer on ROOT, ROUNDS times, checking the archive after each kill.

    Returns how many incomplete writes were moved aside.
    """
    live = Archive(root)
    paths = [live.thread_file(thread) for thread in THREADS]
    acked: set[str] = set()
    torn_seen: dict[Path, set[Path]] = {path: set() for path in paths}
    moved = 0
    try:
        for round_number in range(rounds):
            pid = server.start_writer(root, rng.randrange(1 << 30))
            acks: list[list[str]] = []
            if round_number % 2:
                kill_in_a_write(server, pid, 1 if round_number % 4 == 1 else 0, acks, paths)
            else:
                kill_at_random(pid, rng)
            status = server.wait_ended(pid, acks)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
            assert all(len(turn) in (2, 3) for turn in acks)
            acked.update(message_id for turn in acks for message_id in turn)
            tails = check_reader_view(live, paths, acked)
            if round_number % 4 < 2:
                with Archive(root) as reopened:          # opening repairs
                    moved += check_repaired(reopened, paths, acked, tails, torn_seen)
            else:
                settle_by_appending(live, acked)
                moved += check_repaired(live, paths, acked, tails, torn_seen)
    finally:
        live.close()
    return moved


def test_sigkill_at_any_moment_keeps_whole_turns_only(tmp_path):
    rng = random.Random(SEED)
    server = WriterServer()
    moved = 0
    try:
        for archive_number in range(ARCHIVES):     # a few archives keep every file small
            moved += kill_rounds(server, tmp_path / f"memory-{archive_number}", rng,
                                 KILLS // ARCHIVES)
        # On a busy machine every aimed kill may come after its write ended: aim again.
        for extra in range(MAX_EXTRA_ARCHIVES):
            if moved:
                break
            moved += kill_rounds(server, tmp_path / f"extra-{extra}", rng, KILLS // ARCHIVES)
    finally:
        server.close()
    assert server.process.returncode == 0
    assert moved > 0, "no kill landed inside a write; the test proved nothing about torn turns"
