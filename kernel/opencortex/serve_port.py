"""A serving kernel's EPC port: the home's lock, the bound port, and how it is announced
(the connection file, the port line), all given back when serving ends.

Light on purpose (no asyncio, no pydantic): `opencortex serve` holds the lock, binds
and prints its port line with this alone, before it imports the rest of the kernel or
even reads its configuration (see `serve`), so Emacs, waiting for that line, connects
at once; its calls wait in the listen queue until the kernel is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from opencortex.environ_scrub import scrub_process_environment
from opencortex.files import replace_file
from opencortex.homelock import HomeLock
from opencortex.homepath import home_of

LISTEN_BACKLOG = 16
"""Connections the EPC port queues while the kernel is built (and between accepts)."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "opencortex" if base else Path(f"/tmp/opencortex-{os.getuid()}")


def default_connection_file(home: Path | None = None, runtime: Path | None = None) -> Path:
    """The connection file of the kernel of HOME (default: the default home), in RUNTIME
    (default: `runtime_dir()`)."""
    digest = hashlib.sha256(str(home_of(home)).encode()).hexdigest()[:16]
    return (runtime or runtime_dir()) / f"kernel-{digest}.json"


def new_secret() -> str:
    """64 hex digits from the OS's random source (as `secrets.token_hex(32)`, whose
    import costs the port line more than this)."""
    return os.urandom(32).hex()


class UnsafeDirectory(ValueError):
    """The connection file's directory could be read or changed by someone else."""


def private_directory(path: Path) -> Path:
    """PATH as a directory only this user can change: created 0700 when missing;
    UnsafeDirectory when it is a symlink, belongs to someone else, or is writable
    by group or others (someone could swap the connection file there)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a plain directory (a symlink?); remove it, "
                              "or set XDG_RUNTIME_DIR to a directory of your own")
    if info.st_uid != os.getuid():
        raise UnsafeDirectory(f"{path} belongs to another user (uid {info.st_uid}); remove "
                              "it, or set XDG_RUNTIME_DIR to a directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(f"{path} is writable by group or others (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); if it is yours, run: chmod "
                              f"700 {path}; else use a directory only you can write")
    return path


def write_connection_file(path: Path, port: int, secret: str, **more: Any) -> None:
    """Write the connection file with mode 0600 in a private directory, atomically."""
    private_directory(path.parent)
    replace_file(path, json.dumps({"port": port, "secret": secret, "pid": os.getpid(),
                                   **more}).encode("utf-8"), durable=False)


def listening_socket(port: int) -> socket.socket:
    """A socket bound to 127.0.0.1:PORT (0: any free port) and listening, for the EPC
    server to adopt once the kernel is built (OSError when the port is taken).  As the
    EPC server's own: `socket.create_server` (SO_REUSEADDR set, closed on failure)."""
    return socket.create_server(("127.0.0.1", port), backlog=LISTEN_BACKLOG)


class Bound(NamedTuple):
    """What serving holds for HOME: its LOCK, the LISTENING socket, the connection file
    (WRITTEN, once announced), the EPC SECRET and the wire's WS_TOKEN."""

    home: Path
    lock: HomeLock
    listening: socket.socket
    written: Path
    secret: str
    ws_token: str

    @property
    def port(self) -> int:
        return self.listening.getsockname()[1]

    def announce(self, stdout: TextIO, **extra: Any) -> None:
        """Write the connection file (with EXTRA), record the port in the lock, print the
        port line."""
        write_connection_file(self.written, self.port, self.secret, home=str(self.home),
                              **extra)
        self.lock.record(port=self.port, connection_file=str(self.written))
        stdout.write(f"{self.port}\n")
        stdout.flush()


@contextmanager
def bound_port(home: Path, *, port: int = 0, connection_file: Path | None = None
               ) -> Iterator[Bound]:
    """HOME's lock held (HomeInUse when another kernel serves it) and PORT bound on
    loopback, for the duration; the connection file removed and the lock released after.

    The secret comes from `$OPENCORTEX_SECRET` (Emacs's), the wire's token from
    `$OPENCORTEX_WS_TOKEN`, else new ones; both leave the environment, and the provider
    keys are hidden from /proc/<pid>/environ (see `environ_scrub`)."""
    given = os.environ.pop("OPENCORTEX_SECRET", None)
    given_ws = os.environ.pop("OPENCORTEX_WS_TOKEN", None)
    scrub_process_environment()
    lock = HomeLock(home)
    try:
        written = connection_file or default_connection_file(home)
        private_directory(written.parent)              # refused before anything starts
        listening = listening_socket(port)
        try:
            yield Bound(home, lock, listening, written, given or new_secret(),
                        given_ws or new_secret())
        finally:
            listening.close()
            written.unlink(missing_ok=True)
    finally:
        lock.release()


class Stopped(SystemExit):
    """A stop signal came before the kernel's event loop took them over.  A SystemExit,
    so no `except Exception` on the way swallows it."""


class StopSignals:
    """The stop signals that came before the kernel's event loop took them over (see
    `noting_stop_signals`): noted where they land, acted on where the start checks."""

    def __init__(self) -> None:
        self.received: str | None = None      # the first one's name ("SIGTERM")

    def check(self) -> None:
        """Stopped, when a stop signal came."""
        if self.received is not None:
            raise Stopped(self.received)


@contextmanager
def noting_stop_signals() -> Iterator[StopSignals]:
    """SIGTERM, SIGINT and SIGHUP noted meanwhile, instead of ending the process where it
    stands (so what `bound_port` holds is given back); then as before.  For the
    stretch between the port line and the event loop (the configuration read, the
    imports), whose code checks at its own points and hands them to the loop.

    Noted, not raised: an exception raised where a signal lands (an import, a class
    being made, a thread starting) came out as another error ("unexpected
    RuntimeError", pydantic's SchemaError: exit 1) or left the start hung."""
    noted = StopSignals()

    def note(number: int, frame: Any) -> None:
        if noted.received is None:
            noted.received = signal.Signals(number).name
    before = {number: signal.signal(number, note) for number in STOP_SIGNALS}
    try:
        yield noted
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
