"""Running one command bounded in time and memory, under the reaper.

`run_bounded` starts `reaper.py` (see there) with the command, reads the
command's output as it comes, keeps only its first `keep_bytes` bytes and
counts the rest, and ends at the deadline whatever the command does:

- at the deadline the reaper gets SIGTERM and kills the command's whole tree;
  if it has not exited after STOP_GRACE it gets SIGKILL;
- the output pipe is then closed without waiting for end of file, so a process
  that escaped and still holds the pipe cannot keep the turn waiting;
- after the reaper exits, the last bytes in the pipe get at most EOF_GRACE.

So a run lasts at most timeout + STOP_GRACE + KILL_GRACE + EOF_GRACE, and
usually ends a few milliseconds after the command (or the timeout).  A run
that is cancelled stops the reaper the same way before it lets the
cancellation through (at most STOP_GRACE + KILL_GRACE later).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from opencortex.placement import children

REAPER = Path(__file__).with_name("reaper.py")
STOP_GRACE = 1.0
KILL_GRACE = 0.5
EOF_GRACE = 0.5
REPORT_LIMIT = 4096
STDOUT, STDERR = 1, 2


@dataclass(frozen=True)
class Finished:
    """How a bounded run ended.

    `output` holds the first bytes the command wrote (stdout and stderr
    together), `total_bytes` counts all of them.  `returncode` follows the
    subprocess convention (negative: killed by that signal) and is None when
    the run timed out or the reaper left no report.
    """

    output: bytes
    total_bytes: int
    returncode: int | None
    timed_out: bool


class CappedOutput(asyncio.SubprocessProtocol):
    """Collects the reaper's pipes: the command's output (capped) and the report."""

    def __init__(self, keep_bytes: int):
        loop = asyncio.get_running_loop()
        self.keep_bytes = keep_bytes
        self.kept = bytearray()
        self.total_bytes = 0
        self.report = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        """Keep what fits under the cap, count everything."""
        if fd == STDOUT:
            room = self.keep_bytes - len(self.kept)
            if room > 0:
                self.kept += data[:room]
            self.total_bytes += len(data)
        elif fd == STDERR and len(self.report) < REPORT_LIMIT:
            self.report += data[:REPORT_LIMIT - len(self.report)]

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        """Every pipe is closed and the reaper has exited."""
        self.process_exited()
        if not self.closed.done():
            self.closed.set_result(None)

    def returncode(self) -> int | None:
        """The command's status from the reaper's report; None if there is none."""
        words = bytes(self.report).split(b"\n", 1)[0].split()
        if len(words) != 3 or not words[1].lstrip(b"-").isdigit():
            return None
        kind, number = words[0], int(words[1])
        if kind == b"failed":
            raise OSError(number, os.strerror(number))
        return {b"exited": number, b"signaled": -number}.get(kind)


async def settled(future: asyncio.Future, seconds: float) -> bool:
    """Whether FUTURE is done within SECONDS (it is never cancelled)."""
    if not future.done():
        try:
            await asyncio.wait_for(asyncio.shield(future), max(seconds, 0.0))
        except asyncio.TimeoutError:
            return False
    return True


async def stop(transport: asyncio.SubprocessTransport, output: CappedOutput) -> None:
    """Ask the reaper to clear the command's tree; SIGKILL it if it has not exited in time."""
    try:
        transport.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return
    if await settled(output.exited, STOP_GRACE):
        return
    try:
        transport.kill()
    except ProcessLookupError:
        return
    await settled(output.exited, KILL_GRACE)


def environment_block(env: dict[str, str]) -> bytes:
    """ENV as the reaper reads it: NAME=VALUE entries separated by NUL bytes."""
    return b"\0".join(os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items())


async def run_bounded(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                      keep_bytes: int) -> Finished:
    """Run ARGV in CWD with exactly ENV for at most TIMEOUT seconds, keeping KEEP_BYTES of output.

    Raises OSError when the command (or the reaper) cannot be started.
    """
    if not sys.executable:
        raise OSError(0, "no Python interpreter to run the reaper with")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    with children():                # on any CPU, not the kernel's one (see placement)
        transport, output = await loop.subprocess_exec(
            lambda: CappedOutput(keep_bytes), sys.executable, "-I", "-S", str(REAPER),
            "--parent", str(os.getpid()), "--", *argv,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env={}, start_new_session=True)
    try:
        stdin = transport.get_pipe_transport(0)
        stdin.write(environment_block(env))
        stdin.close()
        timed_out = not await settled(output.exited, deadline - loop.time())
        if timed_out:
            await stop(transport, output)
        await settled(output.closed, EOF_GRACE)
        returncode = None if timed_out else output.returncode()
        return Finished(bytes(output.kept), output.total_bytes, returncode, timed_out)
    except asyncio.CancelledError:
        await stop(transport, output)  # a cancelled turn must not leave the command running
        raise
    finally:
        transport.close()
