"""MCP servers as tools: each configured server runs as a child process over stdio,
supervised, its tools registered as `NAME/tool` in the registry group `mcp:NAME`.

One long-lived asyncio task per server owns the SDK's context managers (the
process, the session), entering and leaving them in that task, and restarts
the server with exponential backoff (BACKOFF_START doubling to BACKOFF_MAX,
back to the start after BACKOFF_RESET seconds up) when its process ends or
it fails to start.  Calls use the live session from the calling task; a call
in flight when the server dies fails at once ("stopped during the call"), a
call while it restarts fails at once ("restarting (retry in N s)").  A
restarted server's tools replace the group, so a changed tool list counts.

Each server runs behind `mcp_relay`, which stops one that sends a message (a
line) over `max_message_bytes`: the SDK's reader would hold all of it.  The
server's environment is exactly its `env` setting (see mcp_settings): the
SDK adds HOME, PATH, ... of its own, which `env -u` takes away again unless
listed.  Its stderr goes to LOG_DIR/mcp-NAME.log when a log directory is
given, else nowhere.  Log lines name the server and what happened, never
content; the SDK's own logger ("mcp"), whose lines quote what a server sent,
is quieted unless its level was set.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import time
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import anyio
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS
from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

from opencortex.placement import children
from opencortex.tools.mcp_schema import SchemaRefused
from opencortex.tools.mcp_settings import McpServerSettings, McpSettings
from opencortex.tools.mcp_tools import MAX_ERROR, build_tool, error_text, result_text
from opencortex.tools.registry import Tool, ToolRegistry
from opencortex.untrusted import model_note

log = logging.getLogger("opencortex.mcp")

BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
BACKOFF_RESET = 60.0     # seconds a server must stay up before backoff starts over
STOP_GRACE = 10.0        # the SDK's own shutdown takes at most about 6.5 s
MAX_TOOLS = 256
MAX_PAGES = 16
MAX_LOG_BYTES = 1 << 20
RELAY = str(Path(__file__).with_name("mcp_relay.py"))   # caps a server's lines (see there)


class McpToolError(RuntimeError):
    """A call to an MCP tool failed; the message says why in a sentence."""


class StartError(RuntimeError):
    """A server could not be started; the message says why."""


class McpServer:
    """One supervised server: its state, its live session, its tools."""

    def __init__(self, name: str, settings: McpServerSettings, registry: ToolRegistry,
                 log_dir: Path | None = None):
        self.name, self.settings, self.registry, self.log_dir = name, settings, registry, log_dir
        self.group = f"mcp:{name}"
        self.state = "starting"      # starting, running, restarting, failed, stopped
        self.reason = ""
        self.tool_count = 0
        self.skipped: list[str] = []
        self.restarts = 0
        self.retry_at: float | None = None
        self.backoff = 0.0           # seconds of the current (or last) wait before a restart
        self.session: ClientSession | None = None
        self._stopping = False
        self._up_since: float | None = None
        self._scope: anyio.CancelScope | None = None
        self._first_attempt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle

    def start(self) -> None:
        """Start supervising (the first connection attempt begins at once)."""
        self._task = asyncio.get_running_loop().create_task(self._supervise(),
                                                            name=f"mcp-{self.name}")

    async def first_attempt(self, timeout: float) -> None:
        """Wait (at most TIMEOUT seconds) until the first start succeeded or failed."""
        try:
            await asyncio.wait_for(self._first_attempt.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def aclose(self) -> None:
        """Stop the server process and the supervision; bounded by STOP_GRACE."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()
        task = self._task
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=STOP_GRACE)
            if not done:
                log.warning("mcp server %s: did not stop within %.0f s; abandoning it",
                            self.name, STOP_GRACE)
                task.cancel()
        self.session = None
        self.state = "stopped"
        self.registry.replace(self.group, [])

    async def _supervise(self) -> None:
        delay = BACKOFF_START
        while not self._stopping:
            self._up_since = None
            try:
                await self._connect()
                why = "the process ended"
            except Exception as error:  # noqa: BLE001 -- any failure means: start again later
                why = _reason(error)
            self.session = None
            self._first_attempt.set()
            if self._stopping:
                break
            was_up = self._up_since is not None
            if was_up and time.monotonic() - self._up_since >= BACKOFF_RESET:
                delay = BACKOFF_START
            self._wait_state(why, delay, was_up)
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._stopping:
                    scope.cancel()
                await anyio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)
        self.retry_at = None

    def _wait_state(self, why: str, delay: float, was_running: bool) -> None:
        """Record (and log) that the server is down for DELAY seconds because of WHY."""
        self.state = "restarting" if was_running else "failed"
        self.reason, self.backoff = why, delay
        self.retry_at = time.monotonic() + delay
        if was_running:
            self.restarts += 1
        log.warning("mcp server %s: %s; %s in %.1f s", self.name, why,
                    "restarting" if was_running else "trying again", delay)

    async def _connect(self) -> None:
        """Run one connection: start, initialize, register tools, wait until it ends."""
        params = self._parameters()
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self._stopping:
                scope.cancel()
            async with AsyncExitStack() as stack:
                errlog = stack.enter_context(self._errlog())
                with children():        # the server on any CPU (see placement)
                    read, write = await stack.enter_async_context(stdio_client(params, errlog))
                ended = anyio.Event()
                sink, inbox = anyio.create_memory_object_stream[Any](0)
                group = await stack.enter_async_context(anyio.create_task_group())
                group.start_soon(_forward, read, sink, ended)
                session = await stack.enter_async_context(ClientSession(inbox, write))
                with anyio.fail_after(self.settings.start_timeout):
                    await session.initialize()
                    listed = await _list_tools(session)
                self._connected(session, listed)
                await ended.wait()
                self.session, self.state, self.retry_at = None, "restarting", None
                group.cancel_scope.cancel()

    def _connected(self, session: ClientSession, listed: list[Any]) -> None:
        """Use SESSION from now on; register the tools LISTED."""
        tools, self.skipped = self._tools(listed)
        left_out = self.registry.replace(self.group, tools)
        for tool in left_out:
            log.warning("mcp server %s: tool %s left out: another group has that name",
                        self.name, tool.name)
        self.tool_count = len(tools) - len(left_out)
        self.session, self.state, self.reason, self.retry_at = session, "running", "", None
        self._up_since = time.monotonic()
        self._first_attempt.set()
        log.info("mcp server %s: running, %d tools", self.name, self.tool_count)

    def _tools(self, listed: list[Any]) -> tuple[list[Tool], list[str]]:
        """Registry tools for the LISTED ones, and a note per tool that cannot be offered."""
        tools, skipped = [], []
        for item in listed[:MAX_TOOLS]:
            try:
                tools.append(build_tool(self.name, item, self.settings.trust, self.call))
            except (ValueError, SchemaRefused) as error:
                skipped.append(model_note(f"{item.name}: {error}", 160))
        if len(listed) > MAX_TOOLS:
            skipped.append(f"{len(listed) - MAX_TOOLS} tools over the limit of {MAX_TOOLS}")
        if skipped:   # their names and reasons are the server's text: report(), not the log
            log.warning("mcp server %s: %d tools not offered", self.name, len(skipped))
        return tools, skipped

    def _parameters(self) -> StdioServerParameters:
        """How to start the process, with exactly the configured environment."""
        command = self.settings.command
        program = shutil.which(os.path.expanduser(command[0]))
        if program is None:
            raise StartError(f"program {model_note(command[0], 80)!r} not found")
        program = os.path.abspath(program)
        env = self.settings.environment(dict(os.environ))
        extra = [name for name in DEFAULT_INHERITED_ENV_VARS
                 if name not in env and name in os.environ]
        args = list(command[1:])
        if extra:    # the SDK always passes these; take them away again
            clearer = shutil.which("env") or "/usr/bin/env"
            if "=" in program:
                raise StartError("the program's path holds '=': list "
                                 f"{', '.join(extra)} in env to run it")
            args = [word for name in extra for word in ("-u", name)] + [program] + args
            program = clearer
        cwd = os.path.expanduser(self.settings.cwd) if self.settings.cwd else None
        if cwd is not None and not os.path.isdir(cwd):
            raise StartError(f"cwd {model_note(str(cwd), 80)!r} is not a directory")
        relayed = ["-I", RELAY, str(self.settings.max_message_bytes), program, *args]
        return StdioServerParameters(command=sys.executable, args=relayed, env=env, cwd=cwd)

    @contextmanager
    def _errlog(self) -> Iterator[Any]:
        """Where the server's stderr goes: its log file, or nowhere."""
        if self.log_dir is None:
            yield subprocess.DEVNULL
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"mcp-{self.name}.log"
        mode = "w" if path.exists() and path.stat().st_size > MAX_LOG_BYTES else "a"
        with open(path, mode, encoding="utf-8", errors="replace") as handle:
            yield handle

    # ---- calls

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """Call TOOL with ARGUMENTS; its result as text, or McpToolError."""
        session = self.session
        if session is None:
            raise McpToolError(self._unavailable())
        timeout = self.settings.timeout
        # send_request, not call_tool: call_tool validates structured results against
        # the server's output schema with a validator that may fetch remote $refs.
        request = mcp_types.CallToolRequest(
            params=mcp_types.CallToolRequestParams(name=tool, arguments=arguments))
        try:
            result = await asyncio.wait_for(
                session.send_request(request, mcp_types.CallToolResult,
                                     request_read_timeout_seconds=timeout), timeout + 5)
        except MCPError as error:
            raise McpToolError(self._call_failed(tool, error)) from None
        except asyncio.TimeoutError:
            raise McpToolError(f"{self.name}/{tool} did not answer within {timeout:g} s") from None
        except Exception as error:  # noqa: BLE001 -- a bad result, the session gone, ...
            raise McpToolError(f"{self.name}/{tool} failed: {_reason(error)}") from None
        if result.is_error:
            raise McpToolError(f"{self.name}/{tool} failed: {error_text(result)}")
        return result_text(result, self.settings.max_result_chars)

    def _unavailable(self) -> str:
        retry = "" if self.retry_at is None else \
            f" (retry in {max(0.0, self.retry_at - time.monotonic()):.0f} s)"
        if self.state in ("restarting", "running"):   # running: the session just ended
            return f"server {self.name} is restarting{retry}"
        if self.state in ("failed", "starting"):
            return f"server {self.name} is not running: {self.reason or 'starting'}{retry}"
        return f"server {self.name} is {self.state}"

    def _call_failed(self, tool: str, error: MCPError) -> str:
        if error.code == CONNECTION_CLOSED and self._stopping:
            return f"server {self.name} was stopped during the call to {tool}"
        if error.code == CONNECTION_CLOSED:
            return (f"server {self.name} stopped during the call to {tool} "
                    "(it is being restarted; the call may or may not have had its effect)")
        if error.code == REQUEST_TIMEOUT:
            return (f"{self.name}/{tool} did not answer within {self.settings.timeout:g} s "
                    "(the call was cancelled)")
        return f"{self.name}/{tool} failed: {model_note(error.message, MAX_ERROR)}"

    def report(self) -> str:
        """One line: the server's state and tool count."""
        trust = self.settings.trust
        if self.state == "running":
            line = f"{self.name}: running, {self.tool_count} tools ({trust})"
            if self.skipped:
                line += f", {len(self.skipped)} not offered"
        elif self.state in ("restarting", "failed"):
            line = f"{self.name}: {self._unavailable()}"
        else:
            line = f"{self.name}: {self.state}"
        return line + (f", restarts: {self.restarts}" if self.restarts else "")


class McpServers:
    """Every configured server: `await start()`, `await aclose()`, `report()`."""

    def __init__(self, settings: McpSettings, registry: ToolRegistry,
                 log_dir: Path | None = None):
        self.servers = {name: McpServer(name, server, registry, log_dir)
                        for name, server in settings.servers.items()}
        sdk_log = logging.getLogger("mcp")
        if sdk_log.level == logging.NOTSET:   # the SDK's log lines quote what servers send
            sdk_log.setLevel(logging.CRITICAL)

    async def start(self, wait: bool = True) -> None:
        """Start every server and (with WAIT) wait, bounded by its start_timeout plus
        STOP_GRACE, for each one's first attempt; without WAIT, tools appear as
        servers come up.  Never raises: a server that does not start is reported
        and retried."""
        for server in self.servers.values():
            server.start()
        if not wait:
            return
        waits = [server.first_attempt(server.settings.start_timeout + STOP_GRACE)
                 for server in self.servers.values()]
        await asyncio.gather(*waits)

    async def aclose(self) -> None:
        """Stop every server process (each bounded by STOP_GRACE, all at once)."""
        await asyncio.gather(*(server.aclose() for server in self.servers.values()))

    def report(self) -> str:
        """One line per server, for doctor and /metrics."""
        if not self.servers:
            return "mcp: no servers configured"
        return "\n".join(f"mcp {server.report()}" for server in self.servers.values())

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per server: state, tools, restarts (for metrics)."""
        return {name: {"state": server.state, "tools": server.tool_count,
                       "restarts": server.restarts} for name, server in self.servers.items()}


async def _forward(source: Any, sink: Any, ended: anyio.Event) -> None:
    """Pass the server's messages on to the session; set ENDED when they stop."""
    try:
        async with sink:
            async for item in source:
                await sink.send(item)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        ended.set()


async def _list_tools(session: ClientSession) -> list[Any]:
    """Every tool the server lists (at most MAX_PAGES pages, MAX_TOOLS + 1 tools)."""
    tools: list[Any] = []
    cursor = None
    for _ in range(MAX_PAGES):
        params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
        result = await session.list_tools(params=params)
        tools += result.tools
        cursor = result.next_cursor
        if not cursor or len(tools) > MAX_TOOLS:
            break
    return tools[:MAX_TOOLS + 1]


def _reason(error: BaseException) -> str:
    """A failure in a short sentence of our own words (server text kept out of logs)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, StartError):
        return str(error)
    if isinstance(error, TimeoutError):
        return "it did not start in time"
    if isinstance(error, MCPError):
        return f"it answered with an error ({error.code})"
    if isinstance(error, OSError):
        return f"it could not be started ({type(error).__name__})"
    return f"it failed ({type(error).__name__})"
