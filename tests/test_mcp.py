"""MCP servers as tools, against a real stdio MCP server (tests/mcp_server.py, written
with the official SDK): registration, risks and trust, argument checks, results,
timeouts, crashes and restarts with backoff, the server's environment, stopping."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.tools import ToolRegistry
from opencortex.tools.mcp import McpServers, McpToolError
from opencortex.tools.mcp_relay import line_after
from opencortex.tools.mcp_settings import McpSettings

SERVER = Path(__file__).resolve().parent / "mcp_server.py"
WAIT = 10.0   # seconds any single wait in these tests may take at most


def server(**settings):
    """Settings of one test server running tests/mcp_server.py."""
    return {"command": [sys.executable, str(SERVER)], "timeout": 5, **settings}


def run(servers: dict, body, log_dir: Path | None = None):
    """Start SERVERS, run BODY(registry, mcp), always stop them; BODY's result."""
    async def main():
        registry = ToolRegistry()
        mcp = McpServers(McpSettings.model_validate({"servers": servers}), registry, log_dir)
        try:
            await asyncio.wait_for(mcp.start(), 40)
            return await body(registry, mcp)
        finally:
            await asyncio.wait_for(mcp.aclose(), 30)
    return asyncio.run(main())


async def call(registry: ToolRegistry, name: str, **args) -> str:
    """Check ARGS as the kernel does, then run the tool (bounded)."""
    checked = registry.validate_call(name, args)
    return await asyncio.wait_for(registry.get(name).run(checked, None), WAIT)


async def until(condition, what: str) -> None:
    """Wait (bounded) until CONDITION() holds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_tools_are_registered_with_names_risks_and_trust(tmp_path):
    async def body(registry, mcp):
        names = {tool.name for tool in registry.all()}
        assert {"notes/lookup", "notes/delete_note", "notes/fetch_page", "notes/pick",
                "web/lookup"} <= names
        assert registry.group_of("notes/lookup") == "mcp:notes"
        risks = {name: registry.get(f"notes/{name}").risk
                 for name in ("lookup", "delete_note", "fetch_page", "sleep")}
        assert risks == {"lookup": "read-only", "delete_note": "writes",
                         "fetch_page": "external", "sleep": "writes"}
        assert registry.get("notes/lookup").trust == "trusted"
        assert registry.get("web/lookup").trust == "untrusted"
        assert registry.get("notes/lookup").description == "Look a word up in the notes."
        assert registry.get("notes/pick").signature() == (
            '(:type :REQUEST :target :tool :action :call :tool "notes/pick" :args '
            '(:count <integer> :mode <"fast"|"slow"> :verbose <t-or-nil, optional> '
            ':pageSize <integer, optional>))')
        assert registry.get("notes/crash").signature().endswith('"notes/crash")')
        return mcp.report()

    report = run({"notes": server(trust="trusted"), "web": server()}, body, tmp_path)
    assert "mcp notes: running, 12 tools (trusted)" in report
    assert "mcp web: running, 12 tools (untrusted)" in report
    assert "mcp test server (full)" in (tmp_path / "mcp-notes.log").read_text()


def test_arguments_are_checked_before_any_call():
    async def body(registry, mcp):
        problems = {}
        for label, args in {"missing": {"mode": "fast"},
                            "type": {"count": "three", "mode": "fast"},
                            "enum": {"count": 3, "mode": "warp"},
                            "extra": {"count": 3, "mode": "fast", "colour": "red"}}.items():
            with pytest.raises(ValueError) as error:
                registry.validate_call("t/pick", args)
            problems[label] = str(error.value)
        checked = registry.validate_call(
            "t/pick", {"count": 3, "mode": "slow", "pagesize": 7, "verbose": None})
        hyphen = registry.validate_call("t/lookup", {"query": "x", "max-results": 2})
        return problems, checked, hyphen, await call(registry, "t/pick", **checked)

    problems, checked, hyphen, answer = run({"t": server()}, body)
    assert problems["missing"] == "tool 't/pick': bad arguments: missing :count"
    assert problems["type"] == ("tool 't/pick': bad arguments: :count must be an integer, "
                                'not "three"')
    assert problems["enum"] == ("tool 't/pick': bad arguments: :mode must be one of "
                                '"fast", "slow", not "warp"')
    assert problems["extra"].startswith("tool 't/pick': bad arguments: :colour is not an "
                                        "argument of this tool (its arguments: :count")
    assert checked == {"count": 3, "mode": "slow", "pageSize": 7, "verbose": False}
    assert hyphen == {"query": "x", "max_results": 2}
    assert answer == "picked 3 slow verbose=False pageSize=7"


def test_a_call_returns_text_capped_and_errors_are_raised():
    async def body(registry, mcp):
        found = await call(registry, "t/lookup", query="org")
        big = await call(registry, "t/big", chars=5000)
        picture = await call(registry, "t/picture")
        with pytest.raises(McpToolError) as failed:
            await call(registry, "t/fail", why="no such note \x1b]0;owned\x07")
        return found, big, picture, str(failed.value)

    found, big, picture, failed = run({"t": server(max_result_chars=300)}, body)
    assert found == "found org (3 at most)"
    assert len(big) <= 300 and big.startswith("xxx") and big.endswith(
        "[result cut to 300 characters]")
    assert picture == "a caption\n[image, 12 KB]"
    assert failed == "t/fail failed: Error executing tool fail: no such note ␛]0;owned␇"


def test_a_slow_tool_times_out_and_the_server_keeps_working():
    async def body(registry, mcp):
        with pytest.raises(McpToolError) as slow:
            await call(registry, "t/sleep", seconds=60)
        return str(slow.value), await call(registry, "t/lookup", query="after")

    slow, after = run({"t": server(timeout=0.5)}, body)
    assert slow == "t/sleep did not answer within 0.5 s (the call was cancelled)"
    assert after == "found after (3 at most)"


def test_a_crashed_server_fails_calls_at_once_and_restarts_with_backoff(tmp_path):
    variant = tmp_path / "variant"

    async def crash(registry, mcp) -> tuple[str, str]:
        """Crash the server while another call is in flight; both errors."""
        slow = asyncio.ensure_future(call(registry, "t/sleep", seconds=60))
        await asyncio.sleep(0.2)
        with pytest.raises(McpToolError) as crashed:
            await call(registry, "t/crash")
        with pytest.raises(McpToolError) as in_flight:
            await asyncio.wait_for(slow, WAIT)
        return str(crashed.value), str(in_flight.value)

    async def body(registry, mcp):
        server = mcp.servers["t"]
        first_pid = await call(registry, "t/pid")
        crashed, in_flight = await crash(registry, mcp)
        await until(lambda: server.retry_at is not None, "the restart to be planned")
        with pytest.raises(McpToolError) as restarting:
            await call(registry, "t/lookup", query="during")
        await until(lambda: server.state == "running", "the restart")
        first = (server.backoff, await call(registry, "t/lookup", query="again"))
        variant.write_text("other")
        await crash(registry, mcp)
        await until(lambda: server.state == "running", "the second restart")
        second = (server.backoff, server.restarts, await call(registry, "t/lookup", query="x"))
        names = {tool.name for tool in registry.all()}
        return (first_pid, crashed, in_flight, str(restarting.value), first, second, names,
                mcp.report())

    env = ["PATH", f"MCP_TEST_VARIANT_FILE={variant}"]
    first_pid, crashed, in_flight, restarting, first, second, names, report = run(
        {"t": server(env=env)}, body)
    assert crashed.startswith("server t stopped during the call to crash (it is being restarted")
    assert in_flight.startswith("server t stopped during the call to sleep")
    assert re.fullmatch(r"server t is restarting \(retry in \d+ s\)", restarting)
    assert first == (0.5, "found again (3 at most)")
    assert second == (1.0, 2, "other x")
    assert names == {"t/lookup", "t/extra"}    # the restarted server's new tool list
    assert report == "mcp t: running, 2 tools (untrusted), restarts: 2"
    with pytest.raises(ProcessLookupError):
        os.kill(int(first_pid), 0)


def test_a_server_sending_an_endless_message_is_stopped_and_the_kernel_holds_little(
        tmp_path):
    """The SDK's reader keeps everything up to a newline; the relay stops a server whose
    line passes max_message_bytes, so the kernel holds about that much at most."""
    async def body(registry, mcp):
        server = mcp.servers["t"]
        first_pid = await call(registry, "t/pid")
        tracemalloc.start()
        try:
            with pytest.raises(McpToolError) as flooded:
                await call(registry, "t/flood", megabytes=64)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        await until(lambda: server.state == "running", "the restart")
        return first_pid, str(flooded.value), peak, await call(registry, "t/lookup", query="x")

    first_pid, flooded, peak, after = run({"t": server(max_message_bytes=1 << 20)}, body,
                                          log_dir=tmp_path)
    assert flooded.startswith("server t stopped during the call to flood")
    assert peak < 16 << 20, peak                     # not the 64 MiB the server sent
    assert after == "found x (3 at most)"
    assert "sent a message over 1048576 bytes; it was stopped" in \
        (tmp_path / "mcp-t.log").read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(int(first_pid), 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="x\n", max_size=64).map(str.encode), max_size=20))
def test_the_relay_stops_at_the_first_chunk_that_makes_a_line_too_long(chunks):
    """What the relay tracks (the unfinished line's length) says exactly what the whole
    output so far would: a line over the cap (here 64, chunks of up to 64 bytes)."""
    def over_in_all_read(count: int) -> bool:
        return any(len(line) > 64 for line in b"".join(chunks[:count]).split(b"\n"))

    line, stopped = 0, None
    for number, chunk in enumerate(chunks, 1):
        line = line_after(chunk, line, 64)
        if line is None:
            stopped = number
            break
    expected = next((n for n in range(1, len(chunks) + 1) if over_in_all_read(n)), None)
    assert stopped == expected


def test_only_the_listed_environment_reaches_the_server(monkeypatch):
    monkeypatch.setenv("OPENCORTEX_TEST_LISTED", "listed")
    monkeypatch.setenv("OPENCORTEX_TEST_UNLISTED", "unlisted")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-for-servers")

    async def body(registry, mcp):
        return (set((await call(registry, "listed/environ")).split()),
                set((await call(registry, "default/environ")).split()))

    listed, default = run({"listed": server(env=["OPENCORTEX_TEST_LISTED", "FIXED=yes"]),
                           "default": server()}, body)
    # Python itself adds LC_CTYPE in the child when it coerces a C locale.
    assert listed - {"LC_CTYPE"} == {"OPENCORTEX_TEST_LISTED", "FIXED"}
    assert default - {"LC_CTYPE"} <= {"PATH", "HOME", "LANG"} and "PATH" in default


def test_aclose_stops_every_server_process():
    async def body(registry, mcp):
        pids = [int(await call(registry, f"{name}/pid")) for name in ("a", "b")]
        await asyncio.wait_for(mcp.aclose(), 30)
        after = registry.all()
        with pytest.raises(McpToolError) as stopped:
            await mcp.servers["a"].call("lookup", {"query": "x"})
        return pids, after, str(stopped.value), mcp.report()

    pids, after, stopped, report = run({"a": server(), "b": server()}, body)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert after == [] and stopped == "server a is stopped"
    assert report == "mcp a: stopped\nmcp b: stopped"


def test_servers_that_do_not_start_are_reported_and_the_rest_run():
    async def body(registry, mcp):
        names = {tool.name for tool in registry.all()}
        with pytest.raises(McpToolError) as missing:
            await mcp.servers["missing"].call("anything", {})
        return names, str(missing.value), mcp.report().splitlines()

    not_mcp = {"command": [sys.executable, "-c", "import time; time.sleep(60)"],
               "start_timeout": 0.5}
    names, missing, report = run({"missing": {"command": ["opencortex-no-such-program"]},
                                  "silent": not_mcp, "t": server()}, body)
    assert names and all(name.startswith("t/") for name in names)
    assert missing.startswith("server missing is not running: program "
                              "'opencortex-no-such-program' not found (retry in")
    assert report[0].startswith("mcp missing: server missing is not running: program")
    assert report[1].startswith("mcp silent: server silent is not running: "
                                "it did not start in time (retry in")
    assert report[2] == "mcp t: running, 12 tools (untrusted)"
