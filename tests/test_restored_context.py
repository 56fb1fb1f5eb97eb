"""A restart restores the working context the thread had, not a smaller one.

The live context sits between the compression target and the threshold; a
start that filled a fresh context with the newest messages compressed them to
the target, so the model saw fewer turns after a restart than before it.  The
checkpoint names where the context started (and the newest small talk let go,
the tokens a context stuck above its threshold waits for, the messages unpinned
in place), and a start restores exactly that.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencortex.conversation.checkpoint import CHECKPOINT, parse_checkpoint
from opencortex.conversation.commands import Commands
from opencortex.conversation.conversations import Conversations
from opencortex.conversation.settings import ConversationSettings
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

LOCAL = Thread("cli", "local")
WORDS = "kernel archive branch budget pressure recall owner thread buffer stream token".split()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def configured(strategy: str) -> ConversationSettings:
    return ConversationSettings(strategy=strategy, budget=400, threshold=0.8, target=0.5,
                                recall_k=0)


def exchange(n: int) -> list[NewMessage]:
    """Turn N: a question and its answer, or (every fifth turn) small talk."""
    if n % 5 == 0:
        return [NewMessage(role="user", text="thanks!", thread=LOCAL),
                NewMessage(role="assistant", text="ok", thread=LOCAL)]
    return [NewMessage(role="user", text=f"Question {n}: how do the {WORDS[n % 11]} and the "
                       f"{WORDS[(n * 7) % 11]} relate?", thread=LOCAL),
            NewMessage(role="assistant", text=f"Answer {n}: the {WORDS[n % 11]} decides the "
                       f"{WORDS[(n * 3) % 11]} number {n * 13}.", thread=LOCAL)]


def shown(context) -> list[tuple[str, str, int, str]]:
    return [(e.id, e.kind, e.turn, e.retention) for e in context.entries]


async def talk(conversations: Conversations, first: int, count: int) -> None:
    for n in range(first, first + count):
        await conversations.record_turn(LOCAL, exchange(n), {"TOKENS_IN": "10"})


def live_and_restarted(root, strategy: str, *steps) -> tuple[list, list]:
    """STEPS (a number: that many turns; text: a command) in one process: the context
    then, and the context of the thread opened by a fresh process."""
    async def live():
        with Archive(root) as archive:
            conversations = Conversations(archive, configured(strategy))
            done = 0
            for step in steps:
                if isinstance(step, int):
                    await talk(conversations, done + 1, step)
                    done += step
                else:
                    await Commands(conversations).run(await conversations.open(LOCAL), step)
            return shown((await conversations.open(LOCAL)).context)

    async def restarted():
        with Archive(root) as archive:
            return shown((await Conversations(archive, configured(strategy)).open(LOCAL)).context)
    return run(live()), run(restarted())


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr("os.fsync", lambda fd: None)      # durability is not under test
    return tmp_path / "memory"


@pytest.mark.parametrize("strategy", ["sliding", "forget"])
@pytest.mark.parametrize("turns", [23, 37, 60])
def test_a_restart_restores_exactly_the_live_context(root, strategy, turns):
    """A start compressed the newest messages to the target: fewer turns than before."""
    live, restarted = live_and_restarted(root, strategy, turns)
    assert live[0][2] > 1                      # older turns did leave the context
    assert restarted == live


@pytest.mark.parametrize("strategy", ["sliding", "forget"])
def test_a_restart_restores_the_live_context_with_a_pin_older_than_it(root, strategy):
    live, restarted = live_and_restarted(root, strategy, 2, "/pin 1", 40)
    assert [turn for _, _, turn, retention in live if retention == "PRESERVED"] == [1, 1]
    assert restarted == live


@pytest.mark.parametrize("strategy", ["sliding", "forget"])
def test_a_restart_after_a_restart_keeps_the_same_context(root, strategy):
    """The context restored by a start is the one the next turns grow and checkpoint."""
    live_and_restarted(root, strategy, 30)
    live, restarted = live_and_restarted(root, strategy, 7)
    assert restarted == live


def edit_last_checkpoint(path, key: str, value: str) -> None:
    text = path.read_text()
    old = re.findall(rf" {key}=\S*", text)[-1]
    at = text.rindex(old)
    path.write_text(text[:at] + f" {key}={value}" + text[at + len(old):])


@pytest.mark.parametrize("edit", ["edited", "older"])
def test_an_edited_or_older_checkpoint_restores_the_newest_messages_as_before(root, edit):
    """An edited checkpoint (its sum no longer matches) or one an older kernel wrote
    (without the context's start) says nothing of the context: the thread is read
    whole, and the context is the newest messages compressed to the target."""
    live, restarted = live_and_restarted(root, "sliding", 23)
    assert restarted == live
    with Archive(root) as archive:
        path = archive.thread_file(LOCAL)
    if edit == "edited":
        edit_last_checkpoint(path, "oldest", "-")     # trusted: the newest turn alone
    else:
        text = path.read_text()
        line = re.findall(r":CHECKPOINT: (.*)", text)[-1]
        signed = re.sub(r" (oldest|smalltalk|above|unpinned)=\S*", "",
                        line.rpartition(" sum=")[0])
        older = f"{signed} sum={zlib.crc32(signed.encode()):08x}"
        path.write_text(text.replace(line, older))
        assert parse_checkpoint(older) is None
    _, restarted = live_and_restarted(root, "sliding")
    assert 2 < len(restarted) < len(live)      # the newest, compressed to the target
    assert {e[0] for e in restarted} < {e[0] for e in live}
    assert CHECKPOINT in path.read_text()


def sized(kind: int, n: int, size: int) -> str:
    """A message of turn N: small talk (kind 0) or SIZE words of content."""
    return "thanks!" if kind == 0 else f"m{n} " + " ".join(WORDS[(n + i) % 11]
                                                          for i in range(size))


shape = st.tuples(st.integers(0, 2), st.integers(1, 60))        # small talk or words
turn_shapes = st.tuples(shape, st.lists(st.tuples(shape, st.sampled_from(["speech", "thought"])),
                                        min_size=1, max_size=3))   # the kernel always replies
turn = st.tuples(st.just("turn"), turn_shapes)
steps = st.lists(st.one_of(
    turn, turn, turn, turn,
    st.tuples(st.just("/pin"), st.integers(1, 40)),
    st.tuples(st.just("/unpin"), st.integers(1, 40)),
    st.tuples(st.just("/strategy"), st.sampled_from(["sliding", "forget"])),
), min_size=15, max_size=45)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(["sliding", "forget"]), budget=st.sampled_from([200, 400]),
       steps=steps)
def test_a_restart_restores_the_live_context_whatever_happened(strategy, budget, steps):
    """Small talk and thoughts (let go first), pins (a context stuck above its threshold
    waits for a band of new tokens), unpins (the message stays in its place), another
    strategy chosen after a turn: a fresh process restores what the live context held."""
    def settings_() -> ConversationSettings:
        return ConversationSettings(strategy=strategy, budget=budget, threshold=0.8,
                                    target=0.5, recall_k=0)

    async def live(root):
        with Archive(root) as archive:
            conversations, turns = Conversations(archive, settings_()), 0
            for op, value in steps:
                if op == "turn":
                    turns += 1
                    (kind, size), replies = value
                    await conversations.record_turn(LOCAL, [
                        NewMessage(role="user", text=sized(kind, turns, size), thread=LOCAL)] + [
                        NewMessage(role="assistant", text=sized(kind, turns, size),
                                   turn_type=how, thread=LOCAL)
                        for (kind, size), how in replies], {})
                elif turns:
                    argument = value if op == "/strategy" else min(value, turns)
                    await Commands(conversations).run(await conversations.open(LOCAL),
                                                      f"{op} {argument}")
            return shown((await conversations.open(LOCAL)).context)

    async def restarted(root):
        with Archive(root) as archive:
            return shown((await Conversations(archive, settings_()).open(LOCAL)).context)

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.fsync", lambda fd: None)
        root = Path(tmp) / "memory"
        before = run(live(root))
        assert run(restarted(root)) == before
