"""The ChatEvent wire: the real server on 127.0.0.1, driven by a real `websockets` client.

Each test runs a kernel (echo or a scripted backend) and `start_wire` in one
event loop, bounded by a deadline, and stops both.  The reference client runs
as a subprocess of its own (`python -m opencortex.wire_client`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from conftest import cli_env
from opencortex.actions import reply_action
from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.llm import EchoBackend
from opencortex.llm.script import ScriptBackend
from opencortex.runtime import build_kernel
from opencortex.wire import WireLimits, WireServer, start_wire
from opencortex.wire_protocol import VERSION
from opencortex.wire_service import TurnLimits

TOKEN = "test-token-" + "x" * 20
DEADLINE = 30.0


def run(scenario: Callable[[], Any]) -> Any:
    """Run the coroutine function SCENARIO within the test deadline."""
    async def bounded():
        async with asyncio.timeout(DEADLINE):
            return await scenario()
    return asyncio.run(bounded())


def cli_reply(text: str) -> str:
    return reply_action("cli", "wire", text).printed()


def chunked(form: str, size: int, delay: float = 0.0) -> dict[str, Any]:
    entry: dict[str, Any] = {"chunks": [form[i:i + size] for i in range(0, len(form), size)]}
    if delay:
        entry["delay"] = delay
    return entry


class Wire:
    """A kernel with its wire server, and what its terminal printer printed."""

    def __init__(self, kernel, server: WireServer, printed: list[str], home: Path):
        self.kernel, self.server, self.printed, self.home = kernel, server, printed, home

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}"

    def archive(self, thread: str = "wire") -> str:
        path = self.home / "memory" / "cli" / f"{thread}.org"
        return path.read_text(encoding="utf-8") if path.exists() else ""


@asynccontextmanager
async def wire(home: Path, *replies: Any, limits: WireLimits | None = None,
               config_text: str = "") -> AsyncIterator[Wire]:
    """A kernel answering REPLIES in order (echo when none) with the wire in front."""
    if config_text:
        (home / "config.toml").write_text(config_text)
    backend = EchoBackend(warning=None)
    if replies:
        script = home / "replies.jsonl"
        script.write_text("".join(json.dumps(r) + "\n" for r in replies), encoding="utf-8")
        backend = ScriptBackend(script)
    printed: list[str] = []
    kernel = build_kernel(load_config(home), backend=backend, writer=printed.append)
    server = await start_wire(kernel, port=0, token=TOKEN, limits=limits)
    try:
        yield Wire(kernel, server, printed, home)
    finally:
        await server.close()
        await kernel.aclose()


class Client:
    """A websockets client speaking the protocol, keeping every event it read."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.session: dict[str, Any] = {}

    @classmethod
    async def open(cls, url: str, *, token: str = TOKEN, session_id: str | None = None,
                   last_sequence: int = 0, **options: Any) -> "Client":
        client = cls(await connect(url, proxy=None, max_size=None, **options))
        data: dict[str, Any] = {"token": token, "last_sequence": last_sequence}
        if session_id:
            data["session_id"] = session_id
        await client.send("auth", data)
        client.session = (await client.until(lambda e: e["event"] == "session"))[-1]["data"]
        return client

    async def send(self, action: str, data: Any, version: Any = VERSION) -> None:
        frame = {"action": action, "version": version, "data": data}
        await self.ws.send(json.dumps(frame))

    async def until(self, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Read events until DONE holds for one; the events read."""
        read = []
        while True:
            event = json.loads(await self.ws.recv())
            self.events.append(event)
            read.append(event)
            if done(event):
                return read

    async def next_error(self) -> dict[str, Any]:
        return (await self.until(lambda e: e["event"] == "error"))[-1]["data"]

    async def turn(self, content: str, correlation_id: str, **data: Any) -> list[dict]:
        """Send a message; its events up to and including its status."""
        await self.send("message", {"content": content, "correlation_id": correlation_id,
                                    **data})
        return await self.until(lambda e: e["event"] == "status"
                                and e["data"]["correlation_id"] == correlation_id)

    async def close(self) -> None:
        await self.ws.close()


def of(events: list[dict], kind: str) -> list[dict]:
    return [e["data"] for e in events if e["event"] == kind]


def check_sequences(events: list[dict]) -> None:
    sequences = [e["sequence"] for e in events]
    assert sequences == sorted(set(sequences)), sequences
    assert all(e["version"] == VERSION and e["timestamp"].endswith("Z") for e in events)


# -- a turn ------------------------------------------------------------------------


def test_a_reply_streams_as_chunks_that_join_to_the_verified_message(home):
    text = "Hello over the wire: ünïcödé 🌍, \"quotes\" and a \\ backslash\nsecond line"

    async def scenario():
        async with wire(home, chunked(cli_reply(text), 7, delay=0.002)) as w:
            client = await Client.open(w.url)
            events = await client.turn("hi", "c1")
            await client.close()
            return client, events, w.archive()

    client, events, archive = run(scenario)
    chunks, [message], [done] = of(events, "chunk"), of(events, "message"), of(events, "done")
    assert "".join(c["text"] for c in chunks) == message["content"] == text
    assert chunks[-1]["final"] and not any(c["final"] for c in chunks[:-1])
    assert all(c["correlation_id"] == "c1" and c["attempt"] == 1 for c in chunks)
    assert message["correlation_id"] == "c1" and message["tokens_used"] > 0
    assert not message["notice"] and message["turn_id"] == done["turn_id"]
    assert done == {**done, "status": "done", "total_chunks": len(chunks)}
    [status] = of(events, "status")
    assert status["thread"] == "cli:wire" and status["view"]["turn"] == 1
    check_sequences(client.events)
    assert client.session["resumed"] is False and client.session["replayed"] == 0
    assert archive.count(text.splitlines()[0]) == 1


def test_chunks_are_coalesced_and_a_rejected_attempt_is_streamed_anew_never_archived(home):
    rejected = '(:type :REQUEST :target :cli :text "REJECTED-PREVIEW" :approved t)'
    kept = "the kept answer " * 40

    async def scenario():
        async with wire(home, chunked(rejected, 3), chunked(cli_reply(kept), 2)) as w:
            client = await Client.open(w.url)
            events = await client.turn("hi", "c1")
            await client.close()
            return events, w.archive()

    events, archive = run(scenario)
    chunks = of(events, "chunk")
    first = [c for c in chunks if c["attempt"] == 1]
    second = [c for c in chunks if c["attempt"] == 2]
    assert "".join(c["text"] for c in first) == "REJECTED-PREVIEW" and first[-1]["final"]
    assert "".join(c["text"] for c in second) == of(events, "message")[0]["content"] == kept
    assert len(second) < len(cli_reply(kept)) // 2, "two-character chunks must be coalesced"
    assert of(events, "done")[0]["total_chunks"] == len(chunks)
    assert "REJECTED-PREVIEW" not in archive and kept.strip() in archive


def test_turn_failures_map_to_the_wire_error_codes(home):
    replies = [{"error": "RATE_LIMITED", "message": "slow down", "retry_after": 7},
               {"error": "LLM_UNAVAILABLE", "message": "nobody home"},
               {"error": "STREAM_TIMEOUT", "message": "stalled"},
               '(:type :REQUEST :target :cli :text "x" :approved t)',
               '(:type :REQUEST :target :cli :text "y" :approved t)']

    async def scenario():
        async with wire(home, *replies) as w:
            client = await Client.open(w.url)
            return [await client.turn("hi", f"c{i}") for i in range(4)]

    turns = run(scenario)
    errors = [of(events, "error") for events in turns]
    assert [e[0]["code"] for e in errors] == ["RATE_LIMITED", "LLM_UNAVAILABLE",
                                              "STREAM_TIMEOUT", "TURN_FAILED"]
    assert errors[0][0]["retry_after_seconds"] == 7 and "slow down" in errors[0][0]["message"]
    assert "retry_after_seconds" not in errors[1][0]
    assert not errors[0][0]["message"].startswith(("System Error", "RATE_LIMITED"))
    assert all(of(events, "done")[0]["status"] in ("failed", "rejected") for events in turns)
    assert all(not of(events, "message") for events in turns)


def test_an_approval_carries_kernel_facts_and_the_answer_decides(home):
    """A command is a step of the turn: asked about with kernel facts; on no, the model
    is told so and answers; on yes, it runs and its output goes to the model."""
    shell = ('(:type :REQUEST :target :shell :cmd ("echo" "approved-output") '
             ':reason "just \\u001b[31m checking")')
    after = cli_reply("answered after the step")

    async def scenario():
        async with wire(home, shell, after, shell, after) as w:
            client = await Client.open(w.url)
            results = []
            for answer, correlation in (("deny", "c1"), ("approve", "c2")):
                await client.send("message", {"content": "run it", "correlation_id": correlation})
                [approval] = of(await client.until(lambda e: e["event"] == "approval"),
                                "approval")
                facts = approval["facts"]
                await client.send(answer, {"approval_id": approval["approval_id"],
                                           "digest": facts["digest"]})
                events = await client.until(lambda e: e["event"] == "done")
                results.append((approval, events))
            await client.send("approve", {"approval_id": results[0][0]["approval_id"]})
            stale = await client.next_error()
            return results, stale, w.archive()

    [(denied, denied_events), (approved, approved_events)], stale, archive = run(scenario)
    facts = denied["facts"]
    assert facts["argv"] == ["echo", "approved-output"] and facts["action-class"] == "shell"
    assert facts["title"] and facts["cwd"] and "model-note" in facts
    assert "\x1b" not in json.dumps(facts, ensure_ascii=False)
    assert denied["correlation_id"] == "c1" and denied["timeout_seconds"] > 0
    [step, message] = of(denied_events, "message")
    assert step["content"] == "⚙ step 1: shell echo approved-output → not approved"
    assert step["notice"] and message["content"] == "answered after the step"
    [step, message] = of(approved_events, "message")
    assert step["content"] == "⚙ step 1: shell echo approved-output → done"
    assert message["content"] == "answered after the step"
    assert of(approved_events, "done")[0]["status"] == "done"
    assert archive.count("denied by the owner") == 1          # the step results, archived
    assert archive.count("(exit 0)") == 1 and "approved-output\n,#+end_example" in archive
    assert stale["code"] == "INVALID_MESSAGE"


def test_abort_stops_a_turn_in_flight_and_nothing_of_it_is_archived(home):
    slow = chunked(cli_reply("slow words " * 200), 4, delay=0.01)

    async def scenario():
        async with wire(home, slow) as w:
            client = await Client.open(w.url)
            await client.send("message", {"content": "take your time", "correlation_id": "c1"})
            await client.until(lambda e: e["event"] == "chunk")
            await client.send("abort", {"correlation_id": "c1"})
            events = await client.until(lambda e: e["event"] == "done")
            await client.send("abort", {})
            nothing = await client.next_error()
            return events, nothing, w.archive()

    events, nothing, archive = run(scenario)
    assert of(events, "done")[0]["status"] == "aborted" and not of(events, "message")
    assert nothing["code"] == "INVALID_MESSAGE"
    assert "take your time" not in archive


# -- malformed frames, authentication, limits -------------------------------------


MALFORMED = [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"action": "dance", "version": "1.0.0", "data": {}}', "unknown action"),
    ('{"action": "message", "version": "2.0.0", "data": {"content": "x"}}', "not supported"),
    ('{"action": "message", "data": {"content": "x"}}', "version is missing"),
    ('{"action": "message", "version": "1.0.0", "data": {}}', "data.content is missing"),
    ('{"action": "message", "version": "1.0.0", "data": {"content": "  "}}', "blank"),
    ('{"action": "message", "version": "1.0.0", "data": {"content": 5}}', "must be a string"),
    ('{"action": "message", "version": "1.0.0", "data": {"content": "x", "mode": "voice"}}',
     "mode"),
    ('{"action": "message", "version": "1.0.0", "data": "x"}', "data must be"),
    ('{"action": "message", "version": "1.0.0", "data": {"content": "x", "thread": "a\\nb"}}',
     "data.thread"),
    ('{"action": "approve", "version": "1.0.0", "data": {}}', "approval_id is missing"),
    ('{"action": "approve", "version": "1.0.0", "data": {"approval_id": "nope"}}',
     "no approval nope"),
    ('{"action": "command", "version": "1.0.0", "data": {"content": "hello"}}', "starts with /"),
    ('{"action": "command", "version": "1.0.0", "data": {"content": "/frobnicate"}}',
     "frobnicate"),
    ('{"action": "auth", "version": "1.0.0", "data": {"token": "t"}}', "authenticated already"),
]


def test_malformed_frames_each_get_invalid_message_and_the_connection_stays(home):
    limits = WireLimits(max_frame_bytes=64 << 10, max_content_bytes=1 << 10)

    async def scenario():
        async with wire(home, limits=limits) as w:
            client = await Client.open(w.url)
            answers = []
            for raw, _ in MALFORMED:
                await client.ws.send(raw)
                answers.append(await client.next_error())
            await client.send("message", {"content": "é" * 600, "correlation_id": "big"})
            answers.append(await client.next_error())
            await client.ws.send(b'{"action": "message"}')
            answers.append(await client.next_error())
            await client.turn("first", "same")
            await client.send("message", {"content": "again", "correlation_id": "same"})
            answers.append(await client.next_error())
            events = await client.turn("still here", "c-last")
            return answers, events

    answers, events = run(scenario)
    expected = [fragment for _, fragment in MALFORMED] + ["1200 bytes", "text frames",
                                                          "used already"]
    for answer, fragment in zip(answers, expected, strict=True):
        assert answer["code"] == "INVALID_MESSAGE" and fragment in answer["message"], answer
    assert answers[-3]["correlation_id"] == "big"
    assert of(events, "message")[0]["content"] == "[Echo] still here"


def test_authentication_by_frame_or_header_and_refusals(home):
    limits = WireLimits(auth_timeout=0.3)

    async def scenario():
        async with wire(home, limits=limits) as w:
            codes = {}
            ws = await connect(w.url, proxy=None)
            await ws.send(json.dumps({"action": "auth", "version": VERSION,
                                      "data": {"token": "wrong"}}))
            codes["wrong token"] = await closed_with(ws)
            ws = await connect(w.url, proxy=None)
            codes["silence"] = await closed_with(ws)
            ws = await connect(w.url, proxy=None)
            await ws.send(json.dumps({"action": "message", "version": VERSION,
                                      "data": {"content": "hi"}}))
            codes["no auth first"] = await closed_with(ws)
            with pytest.raises(InvalidStatus) as refused:
                await connect(w.url, proxy=None,
                              additional_headers={"Authorization": "Bearer wrong"})
            codes["wrong header"] = refused.value.response.status_code
            ws = await connect(w.url, proxy=None,
                               additional_headers={"Authorization": f"Bearer {TOKEN}"})
            client = Client(ws)
            [session] = of(await client.until(lambda e: e["event"] == "session"), "session")
            events = await client.turn("by header", "c1")
            await client.close()
            return codes, session, events

    codes, session, events = run(scenario)
    assert codes == {"wrong token": (1008, "authentication failed"),
                     "silence": (1008, "no auth frame within 0.3 s"),
                     "no auth first": (1008, codes["no auth first"][1]),
                     "wrong header": 401}
    assert "auth" in codes["no auth first"][1]
    assert session["session_id"] and of(events, "message")[0]["content"] == "[Echo] by header"


async def closed_with(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The close code and reason the server ended WS with (reading until then)."""
    try:
        while True:
            await ws.recv()
    except ConnectionClosed:
        return ws.close_code, ws.close_reason


def test_connections_are_capped_and_oversized_frames_close_with_1009(home):
    limits = WireLimits(max_connections=2, max_frame_bytes=16 << 10, max_content_bytes=4 << 10)

    async def scenario():
        async with wire(home, limits=limits) as w:
            first, second = await Client.open(w.url), await Client.open(w.url)
            with pytest.raises(InvalidStatus) as refused:
                await Client.open(w.url)
            await first.ws.send("x" * (32 << 10))
            oversized = await closed_with(first.ws)
            third = await Client.open(w.url)     # the closed one's slot is free again
            events = await third.turn("after", "c1")
            await second.close()
            await third.close()
            return refused.value.response.status_code, oversized, events

    status, oversized, events = run(scenario)
    assert status == 503 and oversized[0] == 1009
    assert of(events, "message")[0]["content"] == "[Echo] after"


# -- sessions: resume, heartbeat, expiry, slow readers ----------------------------


def test_a_reconnect_mid_stream_gets_what_it_missed_without_duplicates(home):
    text = " ".join(f"w{i}" for i in range(400))
    slow = chunked(cli_reply(text), 5, delay=0.003)
    limits = WireLimits(turns=TurnLimits(coalesce_seconds=0.005))

    async def scenario():
        async with wire(home, slow, limits=limits) as w:
            client = await Client.open(w.url)
            await client.send("message", {"content": "stream please", "correlation_id": "c1"})
            seen = await client.until(lambda e: e["event"] == "chunk" and e["data"]["text"])
            seen += await client.until(lambda e: e["event"] == "chunk")
            client.ws.transport.abort()          # the network drops, no close handshake
            last = seen[-1]["sequence"]
            again = await Client.open(w.url, session_id=client.session["session_id"],
                                      last_sequence=last)
            await again.until(lambda e: e["event"] == "status")
            await again.close()
            return seen, again

    seen, again = run(scenario)
    assert again.session["resumed"] is True and again.session["gap"] is False
    # What was missed comes before the `session` event (Client.open reads up to it): the
    # more the kernel sent before the drop, the more of it (a test reading only after the
    # `session` event lost text when the machine was slow).
    replayed = [e["event"] for e in again.events].index("session")
    assert replayed == again.session["replayed"]
    everything = [e for e in seen + again.events if e["event"] != "session"]
    check_sequences(everything)
    chunks = of(everything, "chunk")
    assert "".join(c["text"] for c in chunks) == of(everything, "message")[0]["content"] == text
    assert of(everything, "done")[0]["total_chunks"] == len(chunks)
    check_sequences(again.events)


def test_resume_by_header_heartbeats_and_an_unknown_session(home):
    limits = WireLimits(heartbeat_seconds=0.05)

    async def scenario():
        async with wire(home, limits=limits) as w:
            client = await Client.open(w.url)
            await client.turn("one", "c1")
            beats = await client.until(lambda e: e["event"] == "heartbeat")
            last = beats[-1]["sequence"]
            await client.close()
            headers = {"Authorization": f"Bearer {TOKEN}",
                       "X-OpenCortex-Session": client.session["session_id"],
                       "X-OpenCortex-Last-Sequence": "0"}
            resumed = Client(await connect(w.url, proxy=None, additional_headers=headers))
            replay = await resumed.until(lambda e: e["event"] == "session")
            await resumed.until(lambda e: e["event"] == "heartbeat")
            await resumed.close()
            lost = await Client.open(w.url, session_id="no-such-session", last_sequence=9)
            expired = await lost.next_error()
            events = await lost.turn("two", "c2")
            await lost.close()
            ahead = await connect(w.url, proxy=None)
            await ahead.send(json.dumps({"action": "auth", "version": VERSION, "data": {
                "token": TOKEN, "session_id": lost.session["session_id"],
                "last_sequence": 10 ** 6}}))
            refused = await closed_with(ahead)
            return last, replay, lost.session, expired, events, refused

    last, replay, fresh, expired, events, refused = run(scenario)
    assert refused[0] == 1008 and "ahead" in refused[1]
    kinds = [e["event"] for e in replay]
    assert "heartbeat" not in kinds and kinds[-1] == "session"
    assert kinds[-4:-1] == ["message", "done", "status"]
    assert set(kinds[:-4]) == {"chunk"}
    assert replay[-1]["data"]["resumed"] is True and replay[-1]["sequence"] > last
    assert fresh["resumed"] is False and expired["code"] == "SESSION_EXPIRED"
    assert of(events, "message")[0]["content"] == "[Echo] two"


def test_a_client_that_stops_reading_is_disconnected_and_can_resume(home):
    text = "z" * 100_000
    limits = WireLimits(send_queue_bytes=256 << 10, replay_bytes=128 << 10,
                        close_timeout=0.2, turns=TurnLimits(chunk_max_chars=16))

    async def scenario():
        async with wire(home, chunked(cli_reply(text), 512), limits=limits) as w:
            sock = socket.create_connection(("127.0.0.1", w.server.port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled = await Client.open(w.url, sock=sock, max_queue=1)
            [served] = w.server.server.connections
            served.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            session = w.server.sessions.find(stalled.session["session_id"])
            await stalled.send("message", {"content": "a lot", "correlation_id": "c1"})
            while session.outlet is not None:
                await asyncio.sleep(0.01)
            resumed = await Client.open(w.url, session_id=session.id, last_sequence=0)
            if not of(resumed.events, "status"):
                await resumed.until(lambda e: e["event"] == "status")
            stalled.ws.transport.abort()
            await resumed.close()
            return resumed

    resumed = run(scenario)
    assert resumed.session["resumed"] is True and resumed.session["gap"] is True
    assert of(resumed.events, "message")[0]["content"] == text
    assert of(resumed.events, "done")[0]["status"] == "done"
    check_sequences(resumed.events)


# -- routing ------------------------------------------------------------------------


def test_each_client_gets_only_its_own_turns_and_the_terminal_keeps_the_rest(home):
    async def scenario():
        async with wire(home) as w:
            alice, bob = await Client.open(w.url), await Client.open(w.url)
            await asyncio.gather(alice.turn("from alice", "a1"), bob.turn("from bob", "b1"))
            await w.kernel.handle(chat_message("from the terminal", "cli", "local"))
            return alice, bob, w.printed

    alice, bob, printed = run(scenario)
    assert [m["content"] for m in of(alice.events, "message")] == ["[Echo] from alice"]
    assert [m["content"] for m in of(bob.events, "message")] == ["[Echo] from bob"]
    assert any("[Echo] from the terminal" in text for text in printed)
    assert not any("alice" in text or "bob" in text for text in printed)


def test_commands_answer_as_messages_and_status_as_a_status_event(home):
    async def scenario():
        async with wire(home) as w:
            client = await Client.open(w.url)
            await client.turn("hello", "c1", thread="notes")
            await client.send("command", {"content": "/help", "correlation_id": "h"})
            [help_] = of(await client.until(lambda e: e["event"] == "message"), "message")
            await client.send("command", {"content": "/status", "thread": "notes"})
            [status] = of(await client.until(lambda e: e["event"] == "status"), "status")
            return help_, status

    help_, status = run(scenario)
    assert help_["correlation_id"] == "h" and "/status" in help_["content"]
    assert help_["turn_id"] is None
    assert status["thread"] == "cli:notes" and status["view"]["turn"] == 1


def test_text_that_is_not_valid_unicode_still_makes_valid_frames(home):
    async def scenario():
        async with wire(home, {"chunks": ['(:type :REQUEST :target :cli :text "bad \ud800 x")']}) \
                as w:
            client = await Client.open(w.url)
            return await client.turn("hi", "c1")

    events = run(scenario)
    assert of(events, "chunk")[0]["text"] == "bad \ud800 x"
    assert of(events, "done")[0]["status"] == "failed"


# -- the reference client -------------------------------------------------------------


def test_the_reference_client_chats_answers_approvals_and_rides_out_a_reconnect(home,
                                                                                tmp_path):
    words = " ".join(f"w{i}" for i in range(300))
    shell = '(:type :REQUEST :target :shell :cmd ("echo" "hi") :reason "\\u001b]0;owned\\u0007")'
    replies = [chunked(cli_reply(words), 6, delay=0.004), shell,
               cli_reply("so it was not run"), cli_reply("evil \u001b[2J end")]

    async def scenario():
        async with wire(home, *replies) as w:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "opencortex.wire_client", "--url", w.url,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=cli_env(home, OPENCORTEX_WS_TOKEN=TOKEN))
            try:
                process.stdin.write(b"stream please\n")
                await process.stdin.drain()
                while not any(s.turns for s in w.server.sessions.all()):
                    await asyncio.sleep(0.01)
                [session] = w.server.sessions.all()
                while session.sequence < 10:
                    await asyncio.sleep(0.005)
                session.outlet.close_soon(1012, "restarting")     # drop it mid-stream
                process.stdin.write(b"run it\nn\nshow me\n/status\n")
                process.stdin.close()
                out, err = await process.communicate()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            return process.returncode, out.decode(), err.decode()

    code, out, err = run(scenario)
    assert code == 0, err
    assert out.count(words) == 1, out
    assert "reconnected" in err
    assert "Approval needed: Run a command" in out and "command: echo hi" in out
    assert "the model says (unverified)" in out
    assert "⚙ step 1: shell echo hi → not approved" in out and "so it was not run" in out
    assert "\x1b" not in out and "evil ␛[2J end" in out
    assert "turn=3" in out


async def reference_client(w: Wire, typed: bytes, token: str = TOKEN) -> tuple[int, str, str]:
    """Run the reference client against W with TYPED as its input until it ends: its
    exit status, stdout and stderr (it is killed if the test is cut short)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "opencortex.wire_client", "--url", w.url,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=cli_env(w.home, OPENCORTEX_WS_TOKEN=token))
    try:
        out, err = await process.communicate(typed)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def test_the_reference_client_reports_a_wrong_token(home):
    async def scenario():
        async with wire(home) as w:
            return await reference_client(w, b"hello\n", token="nope")

    code, _, err = run(scenario)
    assert code == 1 and "refused the token" in err


def test_the_reference_client_aborts_on_ctrl_c_and_leaves_on_a_second_one(home):
    slow = chunked(cli_reply("slow words " * 300), 4, delay=0.01)

    async def scenario():
        async with wire(home, slow) as w:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "opencortex.wire_client", "--url", w.url,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=cli_env(home, OPENCORTEX_WS_TOKEN=TOKEN))
            try:
                process.stdin.write(b"take your time\n")
                await process.stdin.drain()
                assert (await process.stdout.read(5)).startswith(b"slow")
                process.send_signal(signal.SIGINT)
                note = b""
                while b"aborted" not in note:
                    note = await process.stderr.readline()
                    assert note, "the client ended before saying the turn was aborted"
                process.send_signal(signal.SIGINT)
                code = await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            return code, w.archive()

    code, archive = run(scenario)
    assert code == 0 and "take your time" not in archive
