"""The archive's files written by a process of their own (`memory.write_process`).

serve has the writer thread's batches written by a child process (its GIL is
not the kernel's).  What must hold: an append is acknowledged only once the
child wrote and fsynced it, and the parent indexes it; a child that dies or
hangs fails exactly the batch it held, with a clear error, and the next batch
starts a new one; while a child starts, and when none can start or children
keep dying in their batches, the thread writes; the child sees no environment
(no keys) and ends when its parent does;
SIGKILLing the child at any moment keeps whole turns only.  A child is paused
with SIGSTOP and killed with SIGKILL; every wait is bounded and every child
is reaped.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from opencortex.events import Thread
from opencortex.memory import Archive, ArchiveError, NewMessage
from opencortex.memory import write_process
from opencortex.memory.retention import forget
from opencortex.memory.write_process import WriterStopped
from test_archive_crash import strict_entries, whole_writes
from test_emacs_e2e import gone

WAIT = 20.0                      # seconds any one wait may take
THREAD = Thread("cli", "in-a-process")
OTHER = Thread("cli", "beside-it")


def said(text: str, thread: Thread = THREAD) -> NewMessage:
    return NewMessage(role="user", text=text, thread=thread)


@pytest.fixture
def archive(tmp_path):
    made = Archive(tmp_path / "memory")
    made.write_in_a_process()
    assert made._write_process.wait_ready(WAIT)
    yield made
    made.close()


def child_of(archive: Archive) -> int:
    """The running writer child's pid (after a write made sure it runs)."""
    pid = archive._write_process.pid
    assert pid is not None and pid != os.getpid()
    return pid


def paused(pid: int) -> bool:
    """Whether PID is stopped (SIGSTOP took effect), waiting at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if state_of(pid) == "T":
            return True
        time.sleep(0.005)
    return False


def test_appends_are_written_by_the_child_and_indexed_by_the_parent(archive):
    futures = [archive.submit([said(f"question {n}"),
                               NewMessage(role="assistant", text=f"answer {n}",
                                          thread=Thread("cli", f"new-{n % 3}"))])
               for n in range(20)]
    stored = [future.result(WAIT) for future in futures]
    pid = child_of(archive)
    assert archive.writes_report() == f"in a process of their own (pid {pid})"
    assert [r.text for r in archive.thread_records(THREAD)] == [f"question {n}"
                                                                 for n in range(20)]
    assert [r.text for r in archive.read_thread(THREAD)] == [f"question {n}" for n in range(20)]
    assert archive.files_made == 4                 # THREAD and new-0, new-1, new-2
    first, second = stored[0], stored[1]
    assert first.before[THREAD] is None and second.before[THREAD] == first.records[0].id
    assert second.records[0].parent == first.records[0].id
    hits = archive.search("answer", owners=None, limit=30)
    assert len(hits) == 20
    assert archive.append([said("a synchronous append")])[0].text == "a synchronous append"
    assert child_of(archive) == pid and archive._write_process.started == 1


def test_a_child_killed_mid_batch_fails_that_batch_and_the_next_starts_a_new_one(archive):
    archive.submit([said("before")]).result(WAIT)
    pid = child_of(archive)
    os.kill(pid, signal.SIGSTOP)
    assert paused(pid)
    pending = archive.submit([said("while it is stopped")])
    time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WriterStopped, match=r"stopped \(killed by signal 9\) while saving; "
                                            "this turn was not confirmed saved"):
        pending.result(WAIT)
    assert gone(pid, WAIT)
    after = archive.submit([said("after")]).result(WAIT)
    assert child_of(archive) != pid and archive._write_process.started == 2
    assert [r.text for r in archive.thread_records(THREAD)] == ["before", "after"]
    assert after.records[0].parent == archive.thread_records(THREAD)[0].id


@pytest.mark.parametrize("text, error", [
    ("stuck", r"did not answer within 0.5 s"),              # sent; the answer never comes
    ("stuck " * 100_000, r"did not take the batch within 0.5 s"),    # 600 KB: never read
])
def test_a_hung_child_fails_its_batch_within_the_timeout_and_is_killed(tmp_path, text, error):
    with Archive(tmp_path / "memory") as archive:
        archive.write_in_a_process(timeout=0.5)
        assert archive._write_process.wait_ready(WAIT)
        archive.submit([said("first")]).result(WAIT)
        pid = child_of(archive)
        os.kill(pid, signal.SIGSTOP)
        assert paused(pid)
        started = time.monotonic()
        with pytest.raises(WriterStopped, match=error):
            archive.submit([said(text)]).result(WAIT)
        assert time.monotonic() - started < WAIT
        assert gone(pid, WAIT)                      # killed and reaped, not left stopped
        archive.submit([said("then")]).result(WAIT)
        assert [r.text for r in archive.thread_records(THREAD)] == ["first", "then"]


def test_pipes_past_file_descriptor_1024_work(tmp_path):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(soft, hard) < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1200, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("cannot open 1,200 files here")
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]   # select() stops at 1024
    try:
        with Archive(tmp_path / "memory") as archive:
            archive.write_in_a_process()
            assert archive._write_process.wait_ready(WAIT)
            assert archive._write_process._requests.fileno() > 1024
            assert archive.submit([said("high " * 20000)]).result(WAIT).records
            assert archive._write_process.failure is None
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_file_the_child_cannot_write_fails_only_its_appends(archive):
    archive.thread_file(OTHER).parent.mkdir(parents=True, exist_ok=True)
    archive.thread_file(OTHER).mkdir()                 # not a file: open fails (EISDIR)
    first = archive.submit([said("one")])
    futures = [archive.submit([said("two")]), archive.submit([said("lost", OTHER)]),
               archive.submit([said("three")])]
    first.result(WAIT)
    with pytest.raises(ArchiveError, match=r"could not save 1 message\(s\) to cli/.*: Is a "
                                           "directory; free disk space or fix permissions"):
        futures[1].result(WAIT)
    assert [f.result(WAIT).records[0].text for f in (futures[0], futures[2])] == ["two", "three"]
    assert [r.text for r in archive.thread_records(THREAD)] == ["one", "two", "three"]
    assert child_of(archive)                              # the same child goes on


@pytest.mark.parametrize("broken", ["exits", "missing interpreter"])
def test_a_child_that_cannot_start_leaves_the_writes_to_the_thread(tmp_path, monkeypatch,
                                                                    caplog, broken):
    if broken == "exits":
        monkeypatch.setattr(write_process, "_CHILD", "import sys; sys.exit(3)")
    else:
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with Archive(tmp_path / "memory") as archive:
        archive.write_in_a_process(start_timeout=WAIT)
        texts = []
        for number in range(200):            # a start fails when the child has ended
            texts.append(f"still saved {number}")
            assert archive.submit([said(texts[-1])]).result(WAIT).records[0].text == texts[-1]
            if archive._write_process.failure is not None:
                break
            time.sleep(0.01)
        assert [r.text for r in archive.read_thread(THREAD)] == texts
        report = archive.writes_report()
        assert report.startswith("in the writer thread (no writer process: ")
        assert ("exit status 3" if broken == "exits" else "FileNotFoundError") in report
        assert archive._write_process.started == (
            write_process.MAX_FAILED_STARTS if broken == "exits" else 0)
    assert "archive writer process" in caplog.text and "still saved" not in caplog.text


def state_of(pid: int) -> str:
    """PID's state letter (R, S, T, Z...) from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_child_killed_before_it_is_ready_costs_nothing(tmp_path):
    with Archive(tmp_path / "memory") as archive:
        archive.write_in_a_process()
        pid = archive._write_process.pid             # started, still importing
        os.kill(pid, signal.SIGKILL)
        assert archive.submit([said("written by the thread")]).result(WAIT).records
        assert archive._write_process.wait_ready(WAIT)
        archive.submit([said("by a new child")]).result(WAIT)
        assert child_of(archive) != pid and archive._write_process.started == 2
        assert archive.writes_report().startswith("in a process of their own (pid ")
        assert [r.text for r in archive.read_thread(THREAD)] == ["written by the thread",
                                                                 "by a new child"]


def killed_while_idle(archive: Archive) -> int:
    """Write "before", then SIGKILL the child and wait until it is dead (not yet
    reaped: the writer has not looked); its pid."""
    archive.submit([said("before")]).result(WAIT)
    pid = child_of(archive)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    while state_of(pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.005)
    return pid


def test_a_child_that_died_while_idle_costs_nothing(archive):
    pid = killed_while_idle(archive)
    assert archive.submit([said("after")]).result(WAIT).records     # a new one is started
    assert gone(pid, WAIT) and archive._write_process.started == 2
    assert [r.text for r in archive.read_thread(THREAD)] == ["before", "after"]


def test_a_child_that_dies_just_after_it_was_found_alive_costs_nothing(archive, monkeypatch):
    pid = killed_while_idle(archive)
    process = archive._write_process
    monkeypatch.setattr(process, "_usable", lambda: True)    # as if it died after the look
    assert archive.submit([said("after " * 30000)]).result(WAIT).records   # > a pipe's buffer
    assert gone(pid, WAIT) and process.started == 1 and process.failure is None
    monkeypatch.undo()
    assert archive.submit([said("later")]).result(WAIT).records
    assert process.started == 2 and process.pid not in (None, pid)
    assert [r.text.split()[0] for r in archive.read_thread(THREAD)] == ["before", "after",
                                                                         "later"]


def test_the_child_gets_no_environment(archive, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-canary-write-process")
    archive._write_process.close()                     # the next write starts a new one
    archive.submit([said("hello")]).result(WAIT)
    assert archive._write_process.wait_ready(WAIT)
    environ = Path(f"/proc/{child_of(archive)}/environ").read_bytes()
    assert b"sk-canary" not in environ and b"API_KEY" not in environ


def test_forgetting_a_thread_while_the_child_runs(archive):
    archive.submit([said("old"), said("older")]).result(WAIT)
    assert forget(archive, THREAD) == 2
    assert not archive.thread_file(THREAD).exists()
    stored = archive.submit([said("new")]).result(WAIT)
    assert stored.before[THREAD] is None and stored.records[0].parent is None
    assert [r.text for r in archive.read_thread(THREAD)] == ["new"]
    assert [r.text for r in archive.thread_records(THREAD)] == ["new"]
    assert archive.files_made == 2


def test_closing_ends_the_child(tmp_path):
    archive = Archive(tmp_path / "memory")
    archive.write_in_a_process()
    assert archive._write_process.wait_ready(WAIT)
    archive.submit([said("one")]).result(WAIT)
    pid = child_of(archive)
    archive.close()
    assert gone(pid, WAIT)
    assert archive.writes_report() == "in a process of their own (started with the next write)"


PARENT = textwrap.dedent("""
    import os, signal, sys
    from opencortex.events import Thread
    from opencortex.memory import Archive, NewMessage
    archive = Archive(sys.argv[1])
    archive.write_in_a_process()
    assert archive._write_process.wait_ready(20)
    thread = Thread("cli", "in-a-process")
    archive.submit([NewMessage(role="user", text="first", thread=thread)]).result(20)
    print(archive._write_process.pid, flush=True)
    big = "x" * 4_000_000
    archive.submit([NewMessage(role="user", text=big, thread=thread)] * 3)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_parent_leaves_whole_writes_and_its_child_ends(tmp_path):
    root = tmp_path / "memory"
    parent = subprocess.run([sys.executable, "-c", PARENT, str(root)], capture_output=True,
                            text=True, timeout=WAIT * 3)
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    child = int(parent.stdout.split()[0])
    try:
        assert gone(child, WAIT)                         # the child ended by itself
    finally:
        if not gone(child, 0):
            os.kill(child, signal.SIGKILL)
    path = root / "cli" / f"{THREAD.chat_id}.org"
    data = path.read_bytes()
    entries = strict_entries(data, len(data))
    assert whole_writes([entry.part for entry in entries])
    assert len(entries) in (1, 4)                        # the big write whole, or not at all
    with Archive(root) as reopened:
        assert len(reopened.thread_records(THREAD)) == len(entries)


def ready_child(archive: Archive, acked: list[str]) -> int:
    """The pid of a child that is ready and answered a write (the last kill may have hit
    it idle, failing the next batch too: then a new one starts)."""
    for _ in range(3):
        assert archive._write_process.wait_ready(WAIT)
        try:
            acked += [r.id for r in archive.submit([said("ready?")]).result(WAIT).records]
        except WriterStopped:
            continue
        return child_of(archive)
    raise AssertionError("no writer child answered three writes in a row")


def test_sigkill_of_the_child_at_any_moment_keeps_whole_turns_only(archive):
    """Turns of large messages are submitted while the child is killed at random moments:
    acknowledged turns are there once, failed ones fail with WriterStopped, and after
    the next append settles the tail every file holds whole writes only."""
    rng = random.Random(20261127)
    text = "a large message line\n" * 20_000
    acked: list[str] = []
    failed = 0
    for _ in range(12):
        pid = ready_child(archive, acked)
        futures: list[Future] = [archive.submit(
            [said(text), NewMessage(role="assistant", text=text, thread=THREAD)])
            for _ in range(4)]
        time.sleep(rng.uniform(0, 0.25))
        os.kill(pid, signal.SIGKILL)
        for future in futures:
            try:
                acked += [record.id for record in future.result(WAIT).records]
            except WriterStopped:
                failed += 1
    assert failed > 0, "no kill landed inside a batch; the test proved nothing"
    ready_child(archive, acked)                         # its append settled the tail
    data = archive.thread_file(THREAD).read_bytes()
    entries = strict_entries(data, len(data))
    assert whole_writes([entry.part for entry in entries])
    ids = [entry.record.id for entry in entries]
    assert len(ids) == len(set(ids)) and set(acked) <= set(ids)
    assert [r.id for r in archive.thread_records(THREAD)] == ids


@pytest.mark.parametrize("setting, shown", [("[memory]\nwrite_process = true\n",
                                             "serve: in a process of its own"),
                                            ("", "in the writer thread ([memory] write_process"),
                                            ("[memory]\nwrite_process = false\n",
                                             "in the writer thread ([memory] write_process")])
def test_doctor_says_where_serve_writes_the_archive(tmp_path, setting, shown):
    from opencortex.config import load_config
    from opencortex.doctor import run_checks
    (tmp_path / "config.toml").write_text(setting)
    [check] = [c for c in run_checks(load_config(tmp_path)) if c.name == "archive writes"]
    assert check.ok and check.detail.startswith(shown)


def test_the_child_imports_from_the_parents_path(tmp_path, monkeypatch):
    """A kernel whose packages come from PYTHONPATH (which the child's -I ignores) still
    gets a working child: it is given the parent's import path."""
    monkeypatch.setattr(sys, "path", list(sys.path) + [str(tmp_path / "elsewhere")])
    assert write_process._import_path()[-1] == str(tmp_path / "elsewhere")
    with Archive(tmp_path / "memory") as archive:
        archive.write_in_a_process()
        assert archive._write_process.wait_ready(WAIT)
        archive.submit([said("through the child")]).result(WAIT)
        assert child_of(archive) and archive._write_process.failure is None


DIES_ON_EVERY_BATCH = (
    "import sys; from multiprocessing.connection import Connection; "
    "requests = Connection(int(sys.argv[2]), writable=False); "
    "replies = Connection(int(sys.argv[3]), readable=False); "
    "replies.send_bytes(b'ready'); requests.recv_bytes(); sys.exit(7)")


def test_children_that_die_in_every_batch_leave_the_writes_to_the_thread(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(write_process, "_CHILD", DIES_ON_EVERY_BATCH)
    with Archive(tmp_path / "memory") as archive:
        archive.write_in_a_process()
        for number in range(write_process.MAX_FAILED_BATCHES):
            assert archive._write_process.wait_ready(WAIT)
            with pytest.raises(WriterStopped, match=r"stopped \(exit status 7\) while saving"):
                archive.submit([said(f"lost {number}")]).result(WAIT)
        assert archive.writes_report() == ("in the writer thread (no writer process: stopped "
                                           "(exit status 7) 3 times in a row)")
        archive.submit([said("saved by the thread")]).result(WAIT)
        assert [r.text for r in archive.read_thread(THREAD)] == ["saved by the thread"]
        assert archive._write_process.started == write_process.MAX_FAILED_BATCHES


def test_a_failure_in_the_child_is_named_by_its_type_only(monkeypatch):
    """What the child answers for an unexpected failure is logged by the kernel, so it is
    the exception's type, never its text (which may quote a message)."""
    import pickle
    import threading
    from multiprocessing.connection import Connection

    def failing(*args):
        raise ValueError("secret words of a message")

    monkeypatch.setattr(write_process, "_written", failing)
    to_child, requests = os.pipe()
    replies, from_child = os.pipe()
    child = threading.Thread(target=write_process.serve_writes, args=(to_child, from_child))
    child.start()
    ask, hear = Connection(requests, readable=False), Connection(replies, writable=False)
    try:
        assert hear.poll(WAIT) and hear.recv_bytes() == write_process.READY
        ask.send_bytes(pickle.dumps(([], [])))
        assert hear.poll(WAIT) and pickle.loads(hear.recv_bytes()) == "ValueError"
    finally:
        ask.close()                          # the child's loop ends at end of input
        child.join(WAIT)
        hear.close()
    assert not child.is_alive()
