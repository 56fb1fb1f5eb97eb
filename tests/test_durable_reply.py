"""A reply is said only once its turn is durable, on every channel (issue 14); one
the platform then refuses stays archived, followed by a mark that it was not delivered
which the context, /history and recall heed (before, it stayed as if delivered).

Before, the actuator said the reply and the turn was archived after: a crash in
between lost a turn the person had seen (and a bridge, handing the message out
again, answered it twice)."""

from __future__ import annotations

import asyncio

import pytest

from opencortex.actuators import ActuatorError, MessageActuator
from opencortex.conversation.delivery import NOT_DELIVERED
from opencortex.events import Thread, chat_message
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

CHANNELS = [("cli", "local"), ("emacs", "main"), ("telegram", "42"), ("signal", "+4915"),
            ("matrix", "!room:example.org")]


class ArchiveWitness(MessageActuator):
    """Says text, noting what the archive held for the thread at that moment."""

    def __init__(self, target: str, kernel, fail: bool = False):
        self.targets = (target,)
        self.kernel = kernel
        self.fail = fail
        self.seen: list[tuple[str, list[str]]] = []

    async def deliver(self, address: str, text: str, key: str | None = None) -> None:
        thread = Thread(self.targets[0], self.chat_id)
        self.seen.append((text, [r.text for r in self.kernel.archive.read_thread(thread)]))
        if self.fail:
            raise ActuatorError("the platform did not take the message")


def witnessed(config, channel: str, chat_id: str, fail: bool = False):
    kernel = build_kernel(config, backend=EchoBackend(), writer=lambda text: None)
    witness = ArchiveWitness(channel, kernel, fail)
    witness.chat_id = chat_id
    kernel.actuators.register(witness)
    return kernel, witness


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


@pytest.mark.parametrize("channel,chat_id", CHANNELS)
def test_the_reply_is_said_after_its_turn_is_archived(config, channel, chat_id):
    kernel, witness = witnessed(config, channel, chat_id)
    result = run(kernel.handle(chat_message("hello there", channel, chat_id)))
    assert result.status == "done", result.errors
    assert len(witness.seen) == 1
    said, archived = witness.seen[0]
    assert "hello there" in said
    assert archived == ["hello there", result.text]


def test_a_reply_the_platform_refuses_after_the_write_fails_the_turn(config):
    kernel, witness = witnessed(config, "telegram", "42", fail=True)
    result = run(kernel.handle(chat_message("hello there", "telegram", "42")))
    assert result.status == "failed"
    assert any("did not take the message" in error for error in result.errors)
    records = kernel.archive.read_thread(Thread("telegram", "42"))
    assert [r.text for r in records][:2] == ["hello there", "[Echo] hello there"]
    assert len(witness.seen) == 1       # said once, not retried, not archived twice


def reply_refused_then_restarted(config, channel: str, chat_id: str):
    """A turn whose reply CHANNEL refused after the write; that kernel's view of it and
    a new kernel's on the same home (a restart)."""
    kernel, witness = witnessed(config, channel, chat_id, fail=True)
    thread = Thread(channel, chat_id)
    result = run(kernel.handle(chat_message("where is the harbour", channel, chat_id)))
    assert result.status == "failed" and len(witness.seen) == 1
    live = run(kernel.conversations.open(thread))
    live_entries = [e.text for e in live.context.entries if e.kind == "message"]
    run(kernel.aclose())
    again, _ = witnessed(config, channel, chat_id)
    return again, thread, result, live_entries


@pytest.mark.parametrize("channel,chat_id", CHANNELS)
def test_a_refused_reply_is_marked_undelivered_in_the_archive(config, channel, chat_id):
    kernel, thread, result, _ = reply_refused_then_restarted(config, channel, chat_id)
    records = kernel.archive.read_thread(thread)
    reply = records[1]
    assert reply.text.endswith("[Echo] where is the harbour") and reply.id == result.ids[-1]
    mark = records[2]           # appended right after its turn: nothing is rewritten
    assert mark.role == "system" and mark.extra["CONTROL"] == "delivery"
    assert mark.extra["TARGET"] == reply.id and mark.extra["DELIVERY"] == "failed"
    assert "DELIVERY" not in reply.extra
    assert kernel.archive.undelivered([r.id for r in records]) == {reply.id}


def test_the_context_and_history_say_a_refused_reply_was_not_delivered(config):
    kernel, thread, result, live = reply_refused_then_restarted(config, "telegram", "42")
    seen = f"{NOT_DELIVERED}[Echo] where is the harbour"
    assert live == ["where is the harbour", seen]
    restarted = run(kernel.conversations.open(thread))
    assert [e.text for e in restarted.context.entries if e.kind == "message"] == live
    history = run(kernel.run_command(thread, "/history"))
    assert "assistant" in history and NOT_DELIVERED.strip() in history
    assert "Not delivered:" not in history


def test_recall_says_a_refused_reply_was_not_delivered_and_never_recalls_the_mark(config):
    kernel, thread, result, _ = reply_refused_then_restarted(config, "telegram", "42")
    mark = kernel.archive.read_thread(thread)[2]
    recalled = kernel.conversations.recall.recall(thread, "harbour delivered platform", k=5)
    assert mark.id not in {entry.id for entry in recalled}
    reply = [entry for entry in recalled if entry.role == "assistant"]
    assert len(reply) == 1 and NOT_DELIVERED + "[Echo]" in reply[0].text
    shown = run(kernel.run_command(thread, "/recall harbour delivered platform"))
    assert NOT_DELIVERED.strip() in shown and "Not delivered:" not in shown
