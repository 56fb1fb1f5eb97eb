"""Between the kernel and an MCP server over stdio: bytes pass both ways unchanged, and a
server that sends a line (one JSON-RPC message) longer than the cap is stopped.

The MCP SDK's stdio reader keeps everything a server writes until a newline, so a
server that never sends one would fill the kernel's memory.  The kernel starts each
server through this relay (`mcp.McpServer`), run by the kernel's own Python in
isolated mode with the standard library alone::

    python -I mcp_relay.py MAX_LINE_BYTES PROGRAM [ARGS...]

It holds one chunk at a time, never a line.  Over the cap it says so on stderr (the
server's log), stops the server and exits with OVER_CAP; the SDK then sees the
connection end and the kernel restarts the server with backoff.  Otherwise it exits
with the server's status.  The server stays in the relay's process group, which the
SDK stops as a whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

CHUNK = 1 << 16           # bytes read at once; the cap is at least this
OVER_CAP = 3              # exit status when the server sent a line over the cap


def _server_input(server_stdin) -> None:
    """Our stdin into the server's, until either ends (then the server's is closed)."""
    try:
        while chunk := os.read(0, CHUNK):
            _write_all(server_stdin.fileno(), chunk)
    except OSError:
        pass
    finally:
        try:
            server_stdin.close()
        except OSError:
            pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def line_after(chunk: bytes, line: int, cap: int) -> int | None:
    """The length of the unfinished line after CHUNK (LINE bytes of it came before),
    or None when a line went over CAP.  A line wholly inside CHUNK is shorter than
    CHUNK, which is at most CAP."""
    first = chunk.find(b"\n")
    if first < 0:
        line += len(chunk)
    elif line + first > cap:
        return None
    else:
        line = len(chunk) - chunk.rfind(b"\n") - 1
    return None if line > cap else line


def relay(cap: int, command: list[str]) -> int:
    """Run COMMAND, relaying stdin and stdout (see the module doc); its exit status."""
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              bufsize=0)
    threading.Thread(target=_server_input, args=(server.stdin,), daemon=True).start()
    line: int | None = 0
    try:
        while chunk := os.read(server.stdout.fileno(), CHUNK):
            line = line_after(chunk, line, cap)
            if line is None:
                sys.stderr.write(f"opencortex: the server sent a message over {cap} bytes; "
                                 "it was stopped\n")
                server.kill()
                server.wait()
                return OVER_CAP
            _write_all(1, chunk)
    except OSError:                             # the kernel's end is gone
        server.kill()
    os.close(1)                 # the server's output ended: so does ours, at once
    return server.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[1].isdigit() or int(argv[1]) < CHUNK:
        sys.stderr.write(f"usage: mcp_relay.py MAX_LINE_BYTES(>={CHUNK}) PROGRAM [ARGS...]\n")
        return 2
    return relay(int(argv[1]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
