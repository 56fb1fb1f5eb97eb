"""A restart restores the working context the thread had, not a smaller one.

The live context sits between the compression target and the threshold; a
start that filled a fresh context with the newest messages compressed them to
the target, so the model saw fewer turns after a restart than before it.  The
checkpoint names where the context started (and the newest small talk let go,
the tokens a context stuck above its threshold waits for, the messages unpinned
in place, the kept summaries it held), and a start restores exactly that, with
every strategy: the same entries in the same order, the same summary text, the
same pins and the same wait for the next compression.  With summarize and
galois a start restored the newest kept summary and every message after it
instead: the small talk already let go came back, the wait was lost, and the
summary was another entry than the live one.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from opencortex.conversation.checkpoint import CHECKPOINT, parse_checkpoint
from opencortex.conversation.commands import Commands
from opencortex.conversation.conversations import Conversations
from opencortex.conversation.settings import ConversationSettings
from opencortex.conversation.summaries import extractive_summarizer
from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory import Archive, ArchiveError, NewMessage

from test_summaries_stored import play as play_steps

LOCAL = Thread("cli", "local")
WORDS = "kernel archive branch budget pressure recall owner thread buffer stream token".split()
STRATEGIES = ["sliding", "forget", "summarize", "galois"]


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


def shown(context) -> list:
    """The entries of CONTEXT, then its state: where it starts, the newest small talk let
    go, the tokens it waits for, what it holds unpinned in place, its summaries (the
    checkpoint's mark) and its strategy."""
    return [(e.id, e.kind, e.turn, e.retention, e.text) for e in context.entries] + [
        (context.mark(), context.strategy)]


class Counting:
    """The extractive summarizer, counting its calls."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, entries, max_tokens):
        self.calls += 1
        return await extractive_summarizer(entries, max_tokens)


async def talk(conversations: Conversations, first: int, count: int) -> None:
    for n in range(first, first + count):
        await conversations.record_turn(LOCAL, exchange(n), {"TOKENS_IN": "10"})


async def play(conversations: Conversations, steps, done: int = 0) -> int:
    """STEPS (a number: that many turns of `talk`; text: a command) after DONE turns;
    the turns done then."""
    return await play_steps(conversations, steps, talk, done)


def live_and_restarted(root, strategy: str, *steps) -> tuple[list, list]:
    """STEPS (a number: that many turns; text: a command) in one process: the context
    then, and the context of the thread opened by a fresh process."""
    async def live():
        with Archive(root) as archive:
            conversations = Conversations(archive, configured(strategy))
            await play(conversations, steps)
            return shown((await conversations.open(LOCAL)).context)
    return run(live()), reopened(root, strategy)


def reopened(root, strategy: str, summarizer=None) -> list:
    """The context of the thread opened by a fresh process (with SUMMARIZER)."""
    async def restarted():
        with Archive(root) as archive:
            conversations = Conversations(archive, configured(strategy), summarizer=summarizer)
            return shown((await conversations.open(LOCAL)).context)
    return run(restarted())


def summaries(rows) -> list:
    return [row for row in rows[:-1] if row[1] == "summary"]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr("os.fsync", lambda fd: None)      # durability is not under test
    return tmp_path / "memory"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("turns", [23, 37, 60])
def test_a_restart_restores_exactly_the_live_context(root, strategy, turns):
    """A start compressed the newest messages to the target: fewer turns than before;
    with summarize and galois it put the newest summary back with every message after
    it, the small talk compression had let go too."""
    live, restarted = live_and_restarted(root, strategy, turns)
    assert live[0][2] > 1 or live[0][1] == "summary"     # older turns did leave the context
    assert bool(summaries(live)) == (strategy in ("summarize", "galois"))
    assert restarted == live


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_restart_restores_the_live_context_with_a_pin_older_than_it(root, strategy):
    live, restarted = live_and_restarted(root, strategy, 2, "/pin 1", 40)
    assert [row[2] for row in live[:-1] if row[3] == "PRESERVED"] == [1, 1]
    assert restarted == live


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_restart_after_a_restart_keeps_the_same_context(root, strategy):
    """The context restored by a start is the one the next turns grow and checkpoint."""
    live_and_restarted(root, strategy, 30)
    live, restarted = live_and_restarted(root, strategy, 7)
    assert restarted == live


@pytest.mark.parametrize("strategy", ["summarize", "galois"])
def test_a_restart_after_the_turn_that_made_a_summary_asks_the_summarizer_nothing(
        root, strategy):
    """The checkpoint is written with a turn, before that turn is added to the context;
    a start adds the turn again, and its fold is made again from the summary kept
    after it, not asked of the summarizer (one `chat -m` is one model request)."""
    async def until_a_summary_is_kept():
        with Archive(root) as archive:
            conversations, path = Conversations(archive, configured(strategy)), \
                archive.thread_file(LOCAL)
            for turns in range(1, 60):          # until the newest write is a summary record
                await talk(conversations, turns, 1)
                if b":CONTROL:  summary" in path.read_bytes().rpartition(b"\n* ")[2]:
                    return turns, shown((await conversations.open(LOCAL)).context)
        raise AssertionError("no summary was made")

    turns, live = run(until_a_summary_is_kept())
    counting = Counting()
    restarted = reopened(root, strategy, counting)
    assert turns > 1 and summaries(live)
    assert restarted == live
    assert counting.calls == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("steps", [
    (2, "/pin 2", 20, "/pin 9", "/unpin 9"),               # pinned and unpinned since
    (3, "/pin 2", 30, "/unpin 2", "/pin 29", "/unpin 29"),
    (25, "/strategy forget", "/strategy summarize", "/strategy galois"),   # the wait lifted
    (25, "/strategy sliding", 3, "/strategy sliding"),                  # the same: not lifted
], ids=["pin-unpin", "unpin-pin-unpin", "strategies", "same-strategy"])
def test_a_restart_restores_the_context_whatever_followed_the_last_turn(root, strategy, steps):
    """A /pin fills the context again from the last checkpoint, as a start does, with the
    message pinned: unpinned again, a start took its turn without that pin, and it
    could leave the context; a strategy chosen and chosen back lifted the wait for the
    next compression, which a start kept."""
    live, restarted = live_and_restarted(root, strategy, *steps)
    assert restarted == live


@pytest.mark.parametrize("strategy", ["summarize", "galois"])
@pytest.mark.parametrize("turns, chatty", [(30, 3), (39, 2)])
def test_a_restart_after_a_branch_changed_restores_the_context_it_was_given(
        root, strategy, turns, chatty):
    """Filled anew after /fork from the branch's newest summary and the messages after
    it (no checkpoint says more: the branch changed), small talk let go included, a
    context that had to be summarized again is checkpointed as it is: a start read the
    newer summary and every message after it instead."""
    async def live():
        with Archive(root) as archive:
            conversations = Conversations(archive, configured(strategy))
            for n in range(1, turns + 1):
                question, answer = exchange(n)
                if n % chatty == 0:
                    answer = NewMessage(role="assistant", text="ok, thanks!", thread=LOCAL)
                await conversations.record_turn(LOCAL, [question, answer], {})
            await play(conversations, (f"/fork {turns}", "/pin 1"))
            return shown((await conversations.open(LOCAL)).context)

    live_context = run(live())
    assert summaries(live_context) and reopened(root, strategy) == live_context


def test_the_next_turns_after_a_restart_go_as_they_would_have(tmp_path, monkeypatch):
    """The same turns in two homes, one process for all of them in the first, a restart
    before each of the last ones in the second: the contexts, named by the position of
    each record in the file, stay the same turn after turn."""
    monkeypatch.setattr("os.fsync", lambda fd: None)
    steps, more = (3, "/pin 2", 14, "/unpin 2", 6, "/strategy galois", 5), 12

    def named(rows, root):
        order = {i: n for n, i in enumerate(re.findall(
            r"(?m)^:ID:\s*(\S+)", (root / "cli" / "local.org").read_text()))}
        name = lambda i: f"summary {order.get(i[8:])}" if i.startswith("summary:") else \
            order[i]
        mark, strategy = rows[-1]
        return [(name(row[0]), *row[1:]) for row in rows[:-1]] + [
            (mark.oldest and name(mark.oldest), mark.smalltalk and name(mark.smalltalk),
             mark.above, sorted(map(name, mark.unpinned)), [name(i) for i in mark.summaries],
             strategy)]

    async def turns(root, steps, done=0, then=0):
        """STEPS after DONE turns, then THEN turns: the contexts after each of these."""
        with Archive(root) as archive:
            conversations = Conversations(archive, configured("summarize"))
            done = await play(conversations, steps, done)
            contexts = []
            for n in range(then):
                await play(conversations, (1,), done + n)
                contexts.append(named(shown((await conversations.open(LOCAL)).context), root))
            return done, contexts

    done, live = run(turns(tmp_path / "one", steps, then=more))
    run(turns(tmp_path / "two", steps))
    restarted = [run(turns(tmp_path / "two", (), done + n, then=1))[1][0] for n in range(more)]
    assert restarted == live
    assert all(any(row[1] == "summary" for row in rows) for rows in live)


@pytest.mark.parametrize("strategy", ["summarize", "galois"])
def test_messages_another_writer_added_after_the_last_turn_come_after_it(root, strategy):
    """The checkpoint's turn is taken as the live context took it, then what a writer
    without checkpoints (an older kernel) added after it; the summary that made room
    for those is kept, and the next start makes it again from there, asking nothing."""
    live, _ = live_and_restarted(root, strategy, 30)
    with Archive(root) as archive:
        other = ThreadLog.load(archive, LOCAL)
        for n in range(31, 39):
            other.append_turn(exchange(n))
        added = [r.id for r in archive.thread_records(LOCAL)[-16:]]
    first, second = Counting(), Counting()
    once, twice = reopened(root, strategy, first), reopened(root, strategy, second)
    assert [row[0] for row in once[-5:-1]] == added[-4:]
    assert summaries(once) and summaries(once) != summaries(live)
    assert first.calls == 1 and second.calls == 0 and twice == once


def test_a_summary_that_could_not_be_kept_leaves_the_context_unknown(root, monkeypatch):
    """A checkpoint names the kept summaries its context holds: one the archive did not
    take has no record, so the turn after it says the context is not known, and a start
    fills it as for a checkpoint of `memory import`."""
    def refused(self, message):
        raise ArchiveError("disk full")

    monkeypatch.setattr(ThreadLog, "keep_summary_async", refused)
    live, restarted = live_and_restarted(root, "summarize", 30)
    with Archive(root) as archive:
        text = archive.thread_file(LOCAL).read_text()
    assert ":CONTROL:  summary" not in text and summaries(live)
    assert parse_checkpoint(re.findall(r":CHECKPOINT: (.*)", text)[-1]).context is None
    assert restarted[-2] == live[-2] and summaries(restarted) != summaries(live)


def edit_last_checkpoint(path, key: str, value: str) -> None:
    text = path.read_text()
    old = re.findall(rf" {key}=\S*", text)[-1]
    at = text.rindex(old)
    path.write_text(text[:at] + f" {key}={value}" + text[at + len(old):])


@pytest.mark.parametrize("edit", ["edited", "older", "previous"])
def test_an_edited_or_older_checkpoint_restores_the_newest_messages_as_before(root, edit):
    """An edited checkpoint (its sum no longer matches) or one an older kernel wrote
    (without the context's start, or without its summaries) says nothing of the
    context: the thread is read whole, and the context is the newest messages
    compressed to the target."""
    live, restarted = live_and_restarted(root, "sliding", 23)
    assert restarted == live
    with Archive(root) as archive:
        path = archive.thread_file(LOCAL)
    if edit == "edited":
        edit_last_checkpoint(path, "oldest", "-")     # trusted: the newest turn alone
    else:
        text = path.read_text()
        line = re.findall(r":CHECKPOINT: (.*)", text)[-1]
        fields = "summaries" if edit == "previous" else "oldest|smalltalk|above|unpinned|summaries"
        signed = re.sub(rf" ({fields})=\S*", "", line.rpartition(" sum=")[0])
        older = f"{signed} sum={zlib.crc32(signed.encode()):08x}"
        path.write_text(text.replace(line, older))
        assert parse_checkpoint(older) is None
    restarted = reopened(root, "sliding")
    assert 2 < len(restarted) < len(live)      # the newest, compressed to the target
    assert {e[0] for e in restarted[:-1]} < {e[0] for e in live[:-1]}
    assert CHECKPOINT in path.read_text()


@pytest.mark.parametrize("strategy", ["summarize", "galois"])
def test_an_edited_checkpoint_restores_the_newest_summary_and_what_followed(root, strategy):
    """With summarize and galois, a checkpoint that says nothing of the context leaves
    the newest kept summary and the messages after it, and asks no summarizer when
    they fit (they did: the summary was made to fit them)."""
    live, _ = live_and_restarted(root, strategy, 40)
    with Archive(root) as archive:
        path = archive.thread_file(LOCAL)
    edit_last_checkpoint(path, "above", "1")
    counting = Counting()
    restarted = reopened(root, strategy, counting)
    kept = summaries(live)[0]
    assert summaries(restarted) == [kept] and restarted[0] == kept
    assert {row[0] for row in live[:-1]} <= {row[0] for row in restarted[:-1]}
    assert counting.calls == 0


def sized(kind: int, n: int, size: int) -> str:
    """A message of turn N: small talk (kind 0) or SIZE words of content."""
    return "thanks!" if kind == 0 else f"m{n} " + " ".join(WORDS[(n + i) % 11]
                                                          for i in range(size))


shape = st.tuples(st.integers(0, 2), st.integers(1, 30))        # small talk or words
turn_shapes = st.tuples(shape, st.lists(st.tuples(shape, st.sampled_from(["speech", "thought"])),
                                        min_size=1, max_size=3))   # the kernel always replies
command = st.one_of(st.tuples(st.just("/pin"), st.integers(1, 40)),
                    st.tuples(st.just("/unpin"), st.integers(1, 40)),
                    st.tuples(st.just("/strategy"), st.sampled_from(STRATEGIES)))
steps = st.lists(st.tuples(turn_shapes, st.sampled_from([False, False, True]), command),
                 min_size=12, max_size=40)  # each a turn, and a command after a third of them


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(STRATEGIES), budget=st.sampled_from([200, 400, 800]),
       steps=steps)
def test_a_restart_restores_the_live_context_whatever_happened(strategy, budget, steps):
    """Small talk and thoughts (let go first), pins (a context stuck above its threshold
    waits for a band of new tokens), unpins (the message stays in its place), another
    strategy chosen after a turn, summaries rolled on: a fresh process restores what
    the live context held, and where it stood, without asking the summarizer."""
    def settings_() -> ConversationSettings:
        return ConversationSettings(strategy=strategy, budget=budget, threshold=0.8,
                                    target=0.5, recall_k=0)

    async def live(root):
        with Archive(root) as archive:
            conversations = Conversations(archive, settings_())
            for turns, (((kind, size), replies), then, (op, value)) in enumerate(steps, 1):
                await conversations.record_turn(LOCAL, [
                    NewMessage(role="user", text=sized(kind, turns, size), thread=LOCAL)] + [
                    NewMessage(role="assistant", text=sized(kind, turns, size),
                               turn_type=how, thread=LOCAL)
                    for (kind, size), how in replies], {})
                if then:
                    argument = value if op == "/strategy" else min(value, turns)
                    await Commands(conversations).run(await conversations.open(LOCAL),
                                                      f"{op} {argument}")
            return shown((await conversations.open(LOCAL)).context)

    async def restarted(root, counting):
        with Archive(root) as archive:
            conversations = Conversations(archive, settings_(), summarizer=counting)
            return shown((await conversations.open(LOCAL)).context)

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.fsync", lambda fd: None)
        root, counting = Path(tmp) / "memory", Counting()
        before = run(live(root))
        event("a summary in the context" if summaries(before) else "no summary")
        assert run(restarted(root, counting)) == before
        assert counting.calls == 0
