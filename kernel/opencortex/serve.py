"""`opencortex serve`: the kernel as an EPC server for Emacs.

The first line on stdout is the port, and nothing is printed before it.  The
secret comes from `$OPENCORTEX_SECRET` when Emacs starts the kernel (and is then
removed from the environment, so no child process inherits it); a kernel started
on its own makes one and writes `{"port", "secret", "pid"}` to a connection file
readable only by the user, removed again on exit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import TextIO

from opencortex.approvals import ApprovalBook
from opencortex.config import Config
from opencortex.emacs import EmacsActuator, EmacsApprover, EmacsLink, EmacsService
from opencortex.epc import KernelEpcServer
from opencortex.llm import Backend
from opencortex.runtime import build_kernel

log = logging.getLogger(__name__)


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "opencortex" if base else Path(f"/tmp/opencortex-{os.getuid()}")


def default_connection_file() -> Path:
    return runtime_dir() / "kernel.json"


def write_connection_file(path: Path, port: int, secret: str) -> None:
    """Write the connection file with mode 0600 (its directory 0700), atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"port": port, "secret": secret, "pid": os.getpid()}, handle)
    os.replace(temporary, path)


async def serve(config: Config, *, port: int = 0, connection_file: Path | None = None,
                stdout: TextIO = sys.stdout, backend: Backend | None = None,
                stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM, SIGINT or SIGHUP (or until STOP is set, when given)."""
    given = os.environ.pop("OPENCORTEX_SECRET", None)
    secret = given or secrets.token_hex(32)
    loop = asyncio.get_running_loop()
    kernel = build_kernel(config, stream=sys.stderr, backend=backend)
    link, book = EmacsLink(config.emacs.call_timeout), ApprovalBook()
    actuator = EmacsActuator(link, config.emacs.max_payload_bytes)
    kernel.actuators.register(actuator)
    kernel.approvers["emacs"] = EmacsApprover(link, book)
    service = EmacsService(kernel, link, book, actuator.piece_bytes)
    server = KernelEpcServer(loop, secret, service.methods(), port=port,
                             max_payload_bytes=config.emacs.max_payload_bytes,
                             on_connect=link.connected)
    written = None
    if given is None or connection_file is not None:
        written = connection_file or default_connection_file()
        write_connection_file(written, server.port, secret)
    stdout.write(f"{server.port}\n")
    stdout.flush()
    for error in kernel.skills.errors:
        print(f"warning: {error}", file=sys.stderr)
    if kernel.backend.warning:
        print(f"warning: {kernel.backend.warning}", file=sys.stderr)
    if stop is None:
        stop = asyncio.Event()
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(number, stop.set)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              daemon=True, name="opencortex-epc")
    thread.start()
    try:
        await stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        for tasks in list(service.running.values()):
            for task in tasks:
                task.cancel()
        await kernel.aclose()
        if written is not None:
            written.unlink(missing_ok=True)
        log.info("kernel stopped")
    return 0
