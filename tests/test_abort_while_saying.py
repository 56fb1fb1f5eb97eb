"""An abort that comes once a turn's reply is decided and being written is refused
(issue 14): the reply is said only after its fsync, so the turn is kept whatever
happens; before, an abort in that window was reported as "aborted, nothing of it
was archived" while the write went on and the reply came anyway."""

from __future__ import annotations

import asyncio

from opencortex.approvals import ApprovalBook
from opencortex.emacs import EmacsActuator, EmacsLink, EmacsService
from opencortex.events import Thread
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

from test_group_commit import gate  # noqa: F401 (the fixture)
from test_wire import Client, of, run, wire


def test_a_wire_abort_while_the_reply_is_written_is_refused_and_the_turn_kept(home, gate):
    async def scenario():
        async with wire(home) as w:
            client = await Client.open(w.url)
            gate.hold()
            await client.send("message", {"content": "keep this", "correlation_id": "c1"})
            await gate.reached()
            await client.send("abort", {"correlation_id": "c1"})
            refused = await client.next_error()
            gate.release()
            events = await client.until(lambda e: e["event"] == "done")
            return refused, events, w.archive()

    refused, events, archive = run(scenario)
    assert "too late to abort" in refused["message"]
    assert of(events, "done")[0]["status"] == "done"
    assert [m["content"] for m in of(events, "message")] == ["[Echo] keep this"]
    assert archive.count("keep this") == 2       # the message and its reply, once


def test_an_emacs_abort_while_the_reply_is_written_is_refused(config, gate):
    async def scenario():
        kernel = build_kernel(config, backend=EchoBackend(), writer=lambda text: None)
        link = EmacsLink()
        actuator = EmacsActuator(link, 1 << 20)
        kernel.actuators.register(actuator)
        service = EmacsService(kernel, link, ApprovalBook(), actuator.piece_bytes)
        try:
            gate.hold()
            await service.send_message("main", "keep this")
            await gate.reached()
            refused = await service.abort_turn("main")
            gate.release()
            [task] = service.running[Thread("emacs", "main")]
            result = await asyncio.wait_for(task, 20)
            return refused, result, kernel.archive.read_thread(Thread("emacs", "main"))
        finally:
            gate.release()
            await kernel.aclose()

    refused, result, records = asyncio.run(scenario())
    assert refused is False
    assert not result.status == "aborted"
    turn = [r for r in records if "CONTROL" not in r.extra]   # no Emacs: its reply is
    assert [r.text for r in turn][0] == "keep this" and len(turn) == 2   # marked undelivered
