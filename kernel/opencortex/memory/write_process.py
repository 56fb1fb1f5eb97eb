"""The archive's file writes made by a process of its own (serve, `[memory] write_process`).

Off by default since serve keeps its threads on one CPU (see `placement`): then
the round trip to the child costs a turn more than the GIL waits it saves (the
README has the figures).  What follows is why it was made.

Under load the writer thread spent most of a batch waiting for Python's GIL,
not for the disk: each file costs about nine system calls (open, flock, stat,
fstat, pread, write, fsync, close) and each lets the GIL go and must take it
back while the event loop and the reading threads hold it (bench_load: 7.6 ms
of a batch's 12 ms, against 1.6 ms with nothing else running).  A child
process has a GIL of its own: the writer thread sends it a batch's files
(`write_files`'s plan, with the jobs' validated messages) and waits for one
answer, so a batch costs the parent two hand-offs instead of ~50.

The child does exactly what `write_files` does in-process, with its own
`Tails`: lock, settle the tail, render, one write per file, fsync, the
directory fsync for new files; it answers each job's records and the entries
of each file written.  The index stays with the parent's writer thread (it
holds the archive's lock and the partition of owners).  So the crash
guarantees are those of `write_files`: a turn is acknowledged only once the
child said its write was fsynced.

A new child takes a moment to start (imports): the batches meanwhile are written
by the thread, as are those of a kernel whose child cannot start at all
(logged; after MAX_FAILED_STARTS in a row, or MAX_FAILED_BATCHES batches in a
row that their child died or hung in, for good).

When the child dies or does not answer within `timeout` seconds, the batch's
appends fail with an ArchiveError saying so (what it wrote before is whole or
moved aside by the next write's settling, as after any crash) and the next
batch starts a new child.  The child gets no
environment (no keys), stops when the parent closes the pipe or dies, and
only ever unpickles what its parent sent through a pipe only they share.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import opencortex
from opencortex.memory.threadfile import ArchiveError, Tails
from opencortex.memory.writer import Job, Written, _Pending, write_files
from opencortex.placement import children

log = logging.getLogger(__name__)

WRITE_TIMEOUT = 60.0      # seconds a batch may take in the child before it is killed
START_TIMEOUT = 30.0      # seconds a new child may take to say it is ready
STOP_TIMEOUT = 5.0        # seconds the child may take to end after its pipe closed
MAX_FAILED_STARTS = 3     # children in a row that never got ready: then writes stay in-thread
MAX_FAILED_BATCHES = 3    # batches in a row a child died or hung in: likewise
READY = b"ready"

_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
          "from opencortex.memory.write_process import serve_writes; "
          "serve_writes(int(sys.argv[2]), int(sys.argv[3]))")


class WriterStopped(ArchiveError):
    """The writing process died or hung; the batch was not confirmed written."""

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason          # for the log: no message content


class _NotStarted(WriterStopped):
    """A new child did not say it was ready."""


class _NotSent(WriterStopped):
    """The child ended before it read the whole batch: it wrote none of it."""


class WriteProcess:
    """A child process writing batches of files (see the module); one batch at a time."""

    def __init__(self, *, timeout: float = WRITE_TIMEOUT, start_timeout: float = START_TIMEOUT):
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.started = 0                      # children started so far
        self.failure: str | None = None       # why no child can be started (then: in-thread)
        self._failed_starts = 0               # children in a row that never got ready
        self._failed_batches = 0              # batches in a row whose child died or hung
        self._guard = threading.Lock()        # one batch, start or stop at a time
        self._child: subprocess.Popen | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self._ready = False
        self._spawned = 0.0                   # when the running child was started (monotonic)
        self._pid = os.getpid()

    # -- the parent's side ----------------------------------------------------

    def start(self) -> None:
        """Start the child now (it gets ready in the background); no-op when running."""
        with self._guard:
            self._spawn()

    @property
    def pid(self) -> int | None:
        """The running child's process id."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def wait_ready(self, timeout: float) -> bool:
        """Whether a child runs and is ready (one is started when none runs), waiting at
        most TIMEOUT seconds (for tests and benchmarks: a write never waits for a child
        that starts)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._guard:
                if self._usable():
                    return True
                if self.failure is not None:
                    return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def report(self) -> str:
        """How files are written, for `/metrics` and doctor."""
        if self.failure is not None:
            return f"in the writer thread (no writer process: {self.failure})"
        pid = self.pid
        return (f"in a process of their own (pid {pid})" if pid is not None
                else "in a process of their own (started with the next write)")

    def write(self, files: list[_Pending], tails: Tails) -> list[Written]:
        """`write_files(FILES, TAILS)`, made by the child (TAILS: used only when no child
        can be started).  When the child dies or hangs meanwhile, FILES' appends fail
        with WriterStopped."""
        with self._guard:
            if self._pid != os.getpid():           # a forked copy: never share the child
                self._forget()
                self._pid = os.getpid()
            if not self._usable():     # none can start, or it is still starting: written here
                return write_files(files, tails)
            try:
                written = self._exchange(files)
            except _NotSent as error:          # it died after it was looked at: none written
                self._kill()
                log.warning("archive writer process had ended (%s); this batch is written "
                            "in the writer thread, the next starts a new one", error.reason)
                return write_files(files, tails)
            except WriterStopped as error:
                self._kill()
                for pending in files:
                    for job, _ in pending.parts:
                        job.fail(error)
                self._failed_batches += 1
                if self._failed_batches >= MAX_FAILED_BATCHES:
                    self.failure = f"{error.reason} {self._failed_batches} times in a row"
                log.error("archive writer process: %s%s", error.reason,
                          "; files are written in the writer thread from now on"
                          if self.failure else "")
                return []
            self._failed_batches = 0
            return written

    def _exchange(self, files: list[_Pending]) -> list[Written]:
        """Send FILES, wait for the answer and put it on their jobs; what was written."""
        jobs = list(dict.fromkeys(job for pending in files for job, _ in pending.parts))
        order = {job: number for number, job in enumerate(jobs)}     # jobs hash by identity
        request = ([(p.thread, str(p.path), p.name,
                     [(order[job], positions) for job, positions in p.parts])
                    for p in files],
                   [(job.messages, job.ids, job.now) for job in jobs])
        answer = self._ask(pickle.dumps(request, pickle.HIGHEST_PROTOCOL))
        if isinstance(answer, str):                # the child's own unexpected failure
            raise WriterStopped(f"the archive's writer process failed ({answer}); this "
                                "turn was not saved", reason=answer)
        outcomes, written = answer
        for job, (records, before, error) in zip(jobs, outcomes):
            job.records = records
            job.before = before
            if error is not None:
                job.fail(error)
        return written

    def _ask(self, request: bytes) -> Any:
        """Send REQUEST, return the child's unpickled answer (bounded by `timeout`)."""
        try:
            self._send(request)
        except OSError as error:       # its end of the pipe closed: it read none or part
            how = self._exit()
            raise _NotSent(f"the archive's writer process had ended ({how})",
                           reason=f"ended ({how})") from error
        try:
            if not self._replies.poll(self.timeout):
                raise WriterStopped(
                    f"the archive's writer process did not answer within {self.timeout:g} s "
                    "(a stuck disk?); this turn was not confirmed saved", reason="no answer")
            return pickle.loads(self._replies.recv_bytes())
        except (EOFError, OSError) as error:
            how = self._exit()
            raise WriterStopped(
                f"the archive's writer process stopped ({how}) while saving; this turn was "
                "not confirmed saved (a new one is started)", reason=f"stopped ({how})") from error

    def _send(self, request: bytes) -> None:
        """Write REQUEST framed as `Connection.send_bytes` frames it, within `timeout`:
        a child that stopped reading (paused) cannot hold the writer thread."""
        size = len(request)
        header = struct.pack("!i", size) if size <= 0x7fffffff else \
            struct.pack("!i", -1) + struct.pack("!Q", size)
        data, fd = memoryview(header + request), self._requests.fileno()
        writable = select.poll()                 # poll: no limit on the fd's number
        writable.register(fd, select.POLLOUT)
        deadline = time.monotonic() + self.timeout
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not writable.poll(max(1, int(left * 1000))):
                raise WriterStopped(
                    f"the archive's writer process did not take the batch within "
                    f"{self.timeout:g} s (paused?); this turn was not saved",
                    reason="not reading")
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                continue

    def _usable(self) -> bool:
        """Whether a ready child can take a batch now; starts one when none runs (one that
        ended before it was ready counts as a failed start)."""
        if self.failure is not None:
            return False
        if self._child is None or self._ready and self._child.poll() is not None:
            self._spawn()                    # none yet, or a ready one ended
            if self.failure is not None:
                return False
        try:
            return self._is_ready()
        except _NotStarted as error:         # nothing was sent to it
            self._kill()
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self.failure = error.reason
            log.error("archive writer process did not start (%s); files are written in the "
                      "writer thread%s", error.reason,
                      " from now on" if self.failure else " until a new one is ready")
            return False

    def _is_ready(self) -> bool:
        """Whether the child said it is ready (False while it starts, which is not waited
        for); _NotStarted when it ended first or took over `start_timeout` seconds."""
        if self._ready:
            return True
        try:
            if not self._replies.poll(0):
                if time.monotonic() - self._spawned < self.start_timeout:
                    return False
                raise EOFError
            if self._replies.recv_bytes() != READY:
                raise EOFError
        except (EOFError, OSError) as error:
            how = self._exit()
            raise _NotStarted(f"the archive's writer process did not start ({how})",
                              reason=how) from error
        self._ready = True
        self._failed_starts = 0
        return True

    def _exit(self, wait: float = 1.0) -> str:
        """How the child ended, in words (waiting at most WAIT seconds for it to end)."""
        child = self._child
        if child is None:
            return "not started"
        try:
            code = child.wait(wait)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def _spawn(self) -> None:
        """Start a child when none runs (recording a failure to start)."""
        if self._child is not None and self._child.poll() is None or self.failure is not None:
            return
        self._forget()
        to_child, requests = os.pipe()       # (read, write) ends
        replies, from_child = os.pipe()
        try:
            with children():            # on any CPU, not the kernel's one (see placement)
                self._child = subprocess.Popen(
                    [sys.executable, "-I", "-c", _CHILD, json.dumps(_import_path()),
                     str(to_child), str(from_child)],
                    pass_fds=(to_child, from_child), env={}, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, start_new_session=True)
        except (OSError, ValueError) as error:      # ValueError: no pass_fds (Windows)
            os.close(requests)
            os.close(replies)
            self.failure = f"{type(error).__name__}: {getattr(error, 'strerror', None) or error}"
            log.error("archive writer process could not be started (%s); files are written "
                      "in the writer thread", self.failure)
            return
        finally:
            os.close(to_child)
            os.close(from_child)
        os.set_blocking(requests, False)     # see `_send`
        self._requests = Connection(requests, readable=False)
        self._replies = Connection(replies, writable=False)
        self._ready = False
        self._spawned = time.monotonic()
        self.started += 1

    def _forget(self) -> None:
        """Drop the pipes to a child that ended (or of the process this was forked from)."""
        for connection in (self._requests, self._replies):
            if connection is not None:
                connection.close()
        self._requests = self._replies = None
        self._child = None

    def _kill(self) -> None:
        """Kill the child (it died, hung or failed) and reap it; the next write starts one."""
        child = self._child
        if child is not None:
            child.kill()
            try:
                child.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:    # stuck in the kernel (a dead disk): left
                log.error("archive writer process %d did not end when killed", child.pid)
        self._forget()

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Let the child end (its current batch first), killing it after TIMEOUT seconds."""
        with self._guard:
            child = self._child
            if child is None or self._pid != os.getpid():
                return
            self._requests.close()
            self._requests = None
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                log.error("archive writer process did not end within %g s; killed", timeout)
            self._kill()


def _import_path() -> list[str]:
    """Where the child imports from: this process's path (it may come from PYTHONPATH,
    which the child's -I ignores), opencortex's own directory first."""
    home = str(Path(opencortex.__file__).resolve().parents[1])
    return [home] + [entry for entry in sys.path if entry and entry != home]


# -- the child's side ---------------------------------------------------------

def serve_writes(requests_fd: int, replies_fd: int) -> None:
    """The child: answer batches of files to write until the parent closes the pipe."""
    requests = Connection(requests_fd, writable=False)
    replies = Connection(replies_fd, readable=False)
    tails = Tails()
    replies.send_bytes(READY)
    while True:
        try:
            request = requests.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            answer: Any = _written(*pickle.loads(request), tails)
        except Exception as error:         # not expected: the parent fails the batch
            answer = type(error).__name__      # its text may quote a message: never logged
        replies.send_bytes(pickle.dumps(answer, pickle.HIGHEST_PROTOCOL))


def _written(files: list, jobs: list, tails: Tails) -> tuple[list, list[Written]]:
    """Write FILES of JOBS (as `WriteProcess._exchange` sent them); each job's
    (records, before, error) and what was written."""
    made = [Job(messages, ids, now) for messages, ids, now in jobs]
    pending = [_Pending(thread, Path(path), name,
                        [(made[number], positions) for number, positions in parts])
               for thread, path, name, parts in files]
    written = write_files(pending, tails)
    return [(job.records, job.before, job.error) for job in made], written
