"""A real stdio MCP server for tests/test_mcp.py, written with the official SDK.

Run as `python tests/mcp_server.py [--variant NAME]`.  Its tools: `lookup`
(read-only), `delete_note` (destructive), `fetch_page` (open-world),
`sleep` (slow), `crash` (the process exits at once), `pick` (a typed
schema: integer with bounds, an enum, a boolean, a camelCase name),
`environ` (the names of its environment variables), `pid`, `big` (a long text), `flood` (megabytes on stdout in one endless line),
`fail` (an error result), `picture` (an image and a text).  `--variant
other` serves a different tool list (`lookup` and `extra`), so a test can
see a restarted server re-registered.  Setting MCP_TEST_VARIANT_FILE names
a file whose content, when present, overrides --variant at start.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import time
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)
OPEN_WORLD = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)


def full_server() -> MCPServer:
    """The server with every test tool."""
    server = MCPServer("opencortex-test")

    @server.tool(annotations=READ_ONLY)
    def lookup(query: str, max_results: int = 3) -> str:
        """Look a word up in the notes."""
        return f"found {query} ({max_results} at most)"

    @server.tool(annotations=DESTRUCTIVE)
    def delete_note(note_id: str) -> str:
        """Delete a note for good."""
        return f"deleted {note_id}"

    @server.tool(annotations=OPEN_WORLD)
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return f"fetched {url}"

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleep, then say so."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def crash() -> str:
        """End the server process at once."""
        os._exit(3)

    @server.tool(annotations=READ_ONLY)
    def pick(count: int, mode: Literal["fast", "slow"], verbose: bool = False,
             pageSize: int = 10) -> str:
        """Pick COUNT items in a MODE."""
        return f"picked {count} {mode} verbose={verbose} pageSize={pageSize}"

    @server.tool(annotations=READ_ONLY)
    def environ() -> str:
        """The names of this server's environment variables."""
        return " ".join(sorted(os.environ))

    @server.tool(annotations=READ_ONLY)
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.tool(annotations=READ_ONLY)
    def big(chars: int) -> str:
        """A text of CHARS characters."""
        return "x" * chars

    @server.tool(annotations=READ_ONLY)
    def flood(megabytes: int) -> str:
        """Write MEGABYTES MiB to the wire with no newline (one endless message), then wait.
        The SDK serves the wire from a duplicate of fd 1 and points fd 1 at stderr."""
        from mcp.server import stdio as sdk_stdio
        claim = getattr(sdk_stdio, "_claims", {}).get(1)
        wire = claim.private_fd if claim is not None and claim.private_fd is not None else 1
        block = b"x" * (1 << 20)
        for _ in range(megabytes):
            os.write(wire, block)
        time.sleep(60)
        return "flooded"

    @server.tool(annotations=READ_ONLY)
    def fail(why: str) -> str:
        """Fail with WHY."""
        raise ToolError(why)

    @server.tool(annotations=READ_ONLY)
    def picture() -> list[TextContent | ImageContent]:
        """A caption and a small image."""
        data = base64.b64encode(b"\x89PNG" + bytes(12 * 1024)).decode()
        return [TextContent(type="text", text="a caption"),
                ImageContent(type="image", data=data, mime_type="image/png")]

    return server


def other_server() -> MCPServer:
    """A server with a different tool list."""
    server = MCPServer("opencortex-test-other")

    @server.tool(annotations=READ_ONLY)
    def lookup(query: str) -> str:
        """Look a word up (other variant)."""
        return f"other {query}"

    @server.tool(annotations=READ_ONLY)
    def extra() -> str:
        """Only in the other variant."""
        return "extra"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="full", choices=("full", "other"))
    variant = parser.parse_args().variant
    variant_file = os.environ.get("MCP_TEST_VARIANT_FILE")
    if variant_file and os.path.exists(variant_file):
        with open(variant_file, encoding="utf-8") as handle:
            variant = handle.read().strip()
    print(f"mcp test server ({variant}) pid {os.getpid()}", file=sys.stderr)
    (other_server() if variant == "other" else full_server()).run("stdio")


if __name__ == "__main__":
    main()
