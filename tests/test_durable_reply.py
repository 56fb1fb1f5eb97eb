"""A reply is said only once its turn is durable, on every channel (issue 14).

Before, the actuator said the reply and the turn was archived after: a crash in
between lost a turn the person had seen (and a bridge, handing the message out
again, answered it twice)."""

from __future__ import annotations

import asyncio

import pytest

from opencortex.actuators import ActuatorError, MessageActuator
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
    assert [r.text for r in records] == ["hello there", "[Echo] hello there"]
    assert len(witness.seen) == 1       # said once, not retried, not archived twice
