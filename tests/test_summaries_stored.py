"""Kept summaries and resuming from the tail (issue 13).

- Summaries the working context makes are records of the thread's org file:
  a restart puts them back without asking the summarizer, a changed thread is
  summarized again only for what is new, they round-trip exactly, never show
  up as something someone said, and a torn one is ignored.
- `ThreadLog.resume` reads only the tail of the file, and gives the same state
  as replaying the whole thread (`load`), whatever happened to the thread.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from opencortex.conversation.branches import CONTROL
from opencortex.conversation.checkpoint import CHECKPOINT, parse_checkpoint
from opencortex.conversation.commands import Commands
from opencortex.conversation.conversations import Conversations, checkpoint_threads
from opencortex.conversation.session import Session
from opencortex.conversation.settings import ConversationSettings
from opencortex.conversation.storedsummaries import (
    FIRST, LAST, STRATEGY, TURNS, restored_entry, stored_summary, summary_message)
from opencortex.conversation.entries import Entry
from opencortex.conversation.summaries import extractive_summarizer
from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory.orgformat import read_entry
from opencortex.memory.retention import forget

LOCAL = Thread("cli", "local")
SUMMARIZE = dict(strategy="summarize", budget=400, threshold=0.8, target=0.5, recall_k=0)
WORDS = "kernel archive branch budget pressure recall owner thread buffer stream token".split()


class Counting:
    """A summarizer that counts its calls and keeps what it was given."""

    def __init__(self):
        self.inputs: list[list[Entry]] = []

    async def __call__(self, entries, max_tokens):
        self.inputs.append(list(entries))
        return await extractive_summarizer(entries, max_tokens)

    @property
    def calls(self) -> int:
        return len(self.inputs)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def question(n: int) -> str:
    return f"Question {n}: how do the {WORDS[n % 11]} and the {WORDS[(n * 7) % 11]} relate?"


async def play(conversations: Conversations, steps, talk, done: int = 0) -> int:
    """STEPS (a number: that many turns, said by TALK; text: a command) after DONE turns;
    the turns done then."""
    for step in steps:
        if isinstance(step, int):
            await talk(conversations, done + 1, step)
            done += step
        else:
            await Commands(conversations).run(await conversations.open(LOCAL), step)
    return done


async def talk(conversations: Conversations, first: int, count: int) -> None:
    for n in range(first, first + count):
        await conversations.record_turn(LOCAL, [
            NewMessage(role="user", text=question(n), thread=LOCAL),
            NewMessage(role="assistant", text=f"Answer {n}: the {WORDS[n % 11]} decides "
                       f"the {WORDS[(n * 3) % 11]} number {n * 13}.", thread=LOCAL)],
            {"TOKENS_IN": "10", "TOKENS_OUT": "5"})


def summaries_in(context) -> list[Entry]:
    return [entry for entry in context.entries if entry.kind == "summary"]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr("os.fsync", lambda fd: None)      # durability is not under test
    return tmp_path / "memory"


# -- kept summaries ---------------------------------------------------------

def test_a_restart_reuses_the_kept_summary_and_asks_the_summarizer_nothing(root):
    counting = Counting()

    async def before():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE),
                                          summarizer=counting)
            await talk(conversations, 1, 40)
            return [(e.kind, e.text) for e in (await conversations.open(LOCAL)).context.entries]

    context = run(before())
    assert counting.calls > 0 and any(kind == "summary" for kind, _ in context)
    for _ in range(2):                      # a restart, and another: nothing to summarize
        again = Counting()

        async def after():
            with Archive(root) as archive:
                conversations = Conversations(archive, ConversationSettings(**SUMMARIZE),
                                              summarizer=again)
                conversation = await conversations.open(LOCAL)
                return [(e.kind, e.text) for e in conversation.context.entries]

        assert run(after()) == context
        assert again.calls == 0


def shown(context) -> list[tuple[str, str, int, str]]:
    return [(e.kind, e.text, e.turn, e.retention) for e in context.entries]


def pinning_scenario(root, *steps) -> tuple[list, list]:
    """STEPS (a number: that many turns; text: a command) in one process; the context
    then, and the context of the thread opened again after a restart."""
    async def live():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE))
            await play(conversations, steps, talk)
            return shown((await conversations.open(LOCAL)).context)

    async def restarted():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE))
            return shown((await conversations.open(LOCAL)).context)
    return run(live()), run(restarted())


def test_pinned_messages_come_back_in_their_order_with_their_turn_numbers(root):
    """Pins outside the window came back ordered by id (random) and as turn 0, so the
    pinned reply often led the prompt, where the chat skill drops a leading reply."""
    live, restarted = pinning_scenario(root, 1, "/pin 1", 40)
    assert restarted == live
    pinned = [(text.split(":")[0], turn) for kind, text, turn, retention in live
              if retention == "PRESERVED"]
    assert pinned == [("Question 1", 1), ("Answer 1", 1)]
    assert any(kind == "summary" for kind, *_ in live)


def test_a_turn_unpinned_after_a_summary_left_it_out_survives_a_restart(root):
    """A summary made while turn 2 was pinned leaves it out; after /unpin, a restart took
    the summary to cover it and turn 2 vanished from the context."""
    live, restarted = pinning_scenario(root, 3, "/pin 2", 40, "/unpin 2")
    assert [text.split(":")[0] for _, text, turn, _ in live if turn == 2] == [
        "Question 2", "Answer 2"]
    assert restarted == live


def test_a_summary_followed_by_more_messages_than_a_start_reads_is_kept(root, monkeypatch):
    """A start looked for the kept summary among the newest WINDOW_MESSAGES messages
    only: with more short messages after it than that, it fell back to those messages
    without the summary, and all older history left the context.  The checkpoint names
    the branch's newest summary, so a start finds it (reading the thread whole once)."""
    monkeypatch.setattr("opencortex.conversation.conversations.WINDOW_MESSAGES", 20)

    async def live():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE))
            await talk(conversations, 1, 20)                      # long turns: a summary
            conversation = await conversations.open(LOCAL)
            assert summaries_in(conversation.context)
            for n in range(30):                                   # 60 short messages
                await conversations.record_turn(LOCAL, [
                    NewMessage(role="user", text=f"q{n}", thread=LOCAL),
                    NewMessage(role="assistant", text=f"a{n}", thread=LOCAL)], {})
            return shown(conversation.context)

    async def restarted():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE))
            return shown((await conversations.open(LOCAL)).context)
    before = run(live())
    assert before[0][0] == "summary" and sum(kind == "message" for kind, *_ in before) > 20
    assert run(restarted()) == before


def test_a_changed_thread_is_summarized_again_only_for_what_is_new(root):
    async def scenario():
        with Archive(root) as archive:
            first = Conversations(archive, ConversationSettings(**SUMMARIZE),
                                  summarizer=Counting())
            await talk(first, 1, 30)
            kept = summaries_in((await first.open(LOCAL)).context)[-1]
        with Archive(root) as archive:        # another process adds turns, summarizing nothing
            other = Conversations(archive, ConversationSettings(recall_k=0))
            await talk(other, 31, 12)
        counting = Counting()
        with Archive(root) as archive:
            again = Conversations(archive, ConversationSettings(**SUMMARIZE),
                                  summarizer=counting)
            conversation = await again.open(LOCAL)
            path = [r.id for r in ThreadLog.load(archive, LOCAL).ancestors()]
        return kept, path, counting, conversation

    kept, path, counting, conversation = run(scenario())
    assert counting.calls == 1
    given = counting.inputs[0]
    assert given[0].kind == "summary" and given[0].text == kept.text   # the kept one, rolled on
    after = path[path.index(kept.covers[-1]) + 1:]
    assert {e.id for e in given[1:]} <= set(after)                     # nothing covered again
    assert any(e.turn > 30 for e in given[1:])
    assert summaries_in(conversation.context)


def test_summary_records_round_trip_exactly_through_org(root):
    text = ("[Summary of turns 1-3] user (turn 1): * not a heading\n#+begin_src hy\n:END:\n"
            ",* comma 🙂\ttab 100% [2020-02-30 Sun] <2026-01-01>\nassistant: done\n")
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        records = log.append_turn([NewMessage(role="user", text="q", thread=LOCAL),
                                   NewMessage(role="assistant", text="a", thread=LOCAL)])
        entry = Entry(id="summary:x", role="system", text=text, turn=1, kind="summary",
                      covers=tuple(r.id for r in records))
        written = log.keep_summary(summary_message(LOCAL, entry, strategy="galois",
                                                   branch="main", turns="1-3"))
        assert written.extra[CONTROL] == "summary" and written.parent is None
        assert written.extra[FIRST] == records[0].id and written.extra[LAST] == records[1].id
        assert (written.extra[STRATEGY], written.extra[TURNS]) == ("galois", "1-3")
        on_disk = archive.read_thread(LOCAL)[-1]                     # orgparse
        data = archive.thread_file(LOCAL).read_bytes()
        strict = read_entry(data[data.rindex(b"\n* ") + 1:]).record  # the strict reader
        assert on_disk == strict == written
        kept = stored_summary(on_disk)
        assert kept.text == text and kept.first_turn == 1
        assert restored_entry(kept, ()).text == text
        assert ThreadLog.load(archive, LOCAL).summaries() == [kept]


def test_summary_records_never_show_up_as_something_someone_said(root):
    async def scenario():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE))
            await talk(conversations, 1, 30)
            conversation = await conversations.open(LOCAL)
            kept = [r for r in archive.read_thread(LOCAL) if r.extra.get(CONTROL) == "summary"]
            word = "Summary"
            return (kept, archive.search(word, limit=50),
                    conversations.recall.recall(LOCAL, word, k=10), conversation,
                    archive.neighbours(conversation.log.head))

    kept, found, recalled, conversation, near = run(scenario())
    assert kept and all(r.text.startswith("[Summary of") for r in kept)
    kept_ids = {r.id for r in kept}
    assert not kept_ids & {hit.id for hit in found}
    assert not any("[Summary of" in entry.text for entry in recalled)
    turns = conversation.log.turns()
    assert not kept_ids & {i for turn in turns for i in turn.ids}
    assert not kept_ids & {r.id for r in near if r is not None}


def test_a_torn_or_malformed_summary_record_is_ignored(root):
    async def open_fresh(archive):
        conversations = Conversations(archive, ConversationSettings(**SUMMARIZE),
                                      summarizer=Counting())
        return await conversations.open(LOCAL)

    async def scenario():
        with Archive(root) as archive:
            conversations = Conversations(archive, ConversationSettings(**SUMMARIZE))
            path = archive.thread_file(LOCAL)
            for turns in range(1, 80):                       # until the last write is a summary
                await talk(conversations, turns, 1)
                full = path.read_bytes()
                start = full.rindex(b"\n* ") + 1
                if b":CONTROL:  summary" in full[start:]:
                    break
            torn = stored_summary(archive.read_thread(LOCAL)[-1]).record_id
            for cut in range(start + 1, len(full), 23):          # a crash mid-write
                path.write_bytes(full[:cut])
                conversation = await open_fresh(archive)        # another process, no repair
                assert conversation.log.turn_count() == turns
                assert [s for s in conversation.log.summaries() if s.record_id == torn] == []
            path.write_bytes(full.replace(b":LAST:", b":LOST:"))   # complete, but unusable
            archive.reindex()
            conversation = await open_fresh(archive)
            assert conversation.log.turn_count() == turns
            assert [s for s in conversation.log.summaries() if s.record_id == torn] == []
        with Archive(root) as archive:                        # a real restart repairs
            path.write_bytes(full[:start + 100])
            archive.repair()
            return turns, await open_fresh(archive)

    turns, conversation = run(scenario())
    assert conversation.log.turn_count() == turns


# -- resuming from the tail --------------------------------------------------

def view(log: ThreadLog, window: int) -> tuple:
    """What a resume must get right without the whole thread."""
    return (log.head, log.branch, log.pins(), log.strategy, log.turn_count(), log.head_tokens(),
            [(e.id, e.turn, e.retention) for e in log.entries(limit=window)],
            [(t.number, t.ids) for t in log.last_turns(2)],
            {pin: log.turn_of(pin) for pin in log.pins()})


def whole(log: ThreadLog) -> tuple:
    return (log.head, log.branch, log.branches(), log.pins(), log.strategy,
            [t.ids for t in log.turns()], log.branch_summaries(), log.head_tokens())


def reply(n: int) -> NewMessage:
    return NewMessage(role="assistant", text=f"a{n}", thread=LOCAL,
                      extra={"TOKENS_IN": str(n), "TOKENS_OUT": "1"})


def checkpointed_turns(log: ThreadLog, count: int, pinned: int | None = None) -> list:
    """COUNT turns appended to LOG, each with its checkpoint, the question of turn PINNED
    (counted from 0; None: none) pinned; the records of the last."""
    for n in range(count):
        records = log.append_turn([NewMessage(role="user", text=f"q{n}", thread=LOCAL),
                                   reply(n)], checkpoint=True)
        if n == pinned:
            log.pin(records[0].id)
    return records


def test_resume_reads_the_tail_only_and_agrees_with_a_whole_replay(root, monkeypatch):
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        records = checkpointed_turns(log, 300, pinned=280)
        log.set_strategy("galois")
        assert parse_checkpoint(records[-1].extra[CHECKPOINT]).turns == 299
        whole_view = view(ThreadLog.load(archive, LOCAL), 20)

        def no_whole_replay(thread):
            raise AssertionError("the whole thread was read")

        monkeypatch.setattr(archive, "thread_records", no_whole_replay)
        resumed = ThreadLog.resume(archive, LOCAL, window=20)
        assert resumed._partial and view(resumed, 20) == whole_view
        session = Session.from_log(resumed)
        assert (session.turns, session.tokens) == (300, sum(range(300)) + 300)
        conversation = run(Conversations(archive, ConversationSettings(recall_k=0)).open(LOCAL))
        assert conversation.log.turn_count() == 300 and conversation.session.turns == 300
        assert conversation.context.strategy == "galois"
        assert [e.retention for e in conversation.context.entries].count("PRESERVED") == 1
        resumed.append_turn([NewMessage(role="user", text="more", thread=LOCAL)])
        monkeypatch.undo()
        assert resumed.turn_count() == 301
        assert whole(resumed) == whole(ThreadLog.load(archive, LOCAL))   # made whole on demand


@pytest.mark.parametrize("edit", ["turns=999", "tokens=1", "branch=other", "strategy=galois",
                                  "pins=PINNED"])
def test_a_hand_edited_checkpoint_is_no_checkpoint(root, edit):
    """A checkpoint's values were trusted as written: turns=999 numbered every later turn
    wrong and made /pin of a turn past the real count raise IndexError; pins, branch and
    strategy edits changed the state.  Its sum no longer matches: the thread is read
    whole, and the state is the file's."""
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        for n in range(40):
            records = log.append_turn([NewMessage(role="user", text=f"q{n}", thread=LOCAL),
                                       reply(n)], checkpoint=True)
        truth = ThreadLog.load(archive, LOCAL)
        expected = (view(truth, 20), truth.turn_count(), truth.head_tokens(), truth.branch,
                    truth.strategy, truth.pins())
        path = archive.thread_file(LOCAL)
        text = path.read_text()
        key = edit.split("=")[0]
        old = re.findall(rf" {key}=\S*", text)[-1]
        new = " " + edit.replace("PINNED", records[0].id)
        path.write_text(text[:text.rindex(old)] + new + text[text.rindex(old) + len(old):])
    with Archive(root) as archive:
        resumed = ThreadLog.resume(archive, LOCAL, window=20)
        assert (view(resumed, 20), resumed.turn_count(), resumed.head_tokens(), resumed.branch,
                resumed.strategy, resumed.pins()) == expected
        with pytest.raises(ValueError, match="there is no turn 41"):
            resumed.turn(41)


def test_a_thread_filled_without_checkpoints_resumes_from_its_tail_once_one_is_written(
        root, monkeypatch):
    with Archive(root) as archive:
        for start in range(0, 600, 200):          # as `memory import` writes, in batches
            archive.append([NewMessage(role="user" if n % 2 == 0 else "assistant",
                                       text=f"m{n}", thread=LOCAL)
                            for n in range(start, start + 200)])
        assert checkpoint_threads(archive, [Thread("cli", "empty")]) == 0   # fits the window
        assert not ThreadLog.resume(archive, LOCAL, window=20)._partial    # read whole
        assert checkpoint_threads(archive, [LOCAL]) == 1
        records = archive.thread_records(LOCAL)
        assert records[-1].extra[CONTROL] == "checkpoint" and CHECKPOINT in records[-1].extra
        assert records[-1].text == "Checkpoint after 300 turns (a restart resumes here)"
        loaded = ThreadLog.load(archive, LOCAL)
        monkeypatch.setattr(archive, "thread_records", lambda thread: 1 / 0)
        resumed = ThreadLog.resume(archive, LOCAL, window=20)
        assert resumed._partial and view(resumed, 20) == view(loaded, 20)
        assert [e.text for e in resumed.entries(limit=2)] == ["m598", "m599"]   # not shown
        resumed.append_turn([NewMessage(role="user", text="after", thread=LOCAL), reply(1)],
                            checkpoint=True)
        monkeypatch.undo()
        assert whole(resumed) == whole(ThreadLog.load(archive, LOCAL))
        stale = ThreadLog.load(archive, LOCAL)
        archive.append([NewMessage(role="user", text="outside", thread=LOCAL)])
        stale.append_turn([NewMessage(role="user", text="late", thread=LOCAL)])
        assert stale.write_checkpoint() is None        # its view is not the file's


def test_resume_notices_another_writer_and_forgotten_messages(root):
    with Archive(root) as archive:
        mine, theirs = ThreadLog.load(archive, LOCAL), ThreadLog.load(archive, LOCAL)
        for n in range(5):
            mine.append_turn([NewMessage(role="user", text=f"q{n}", thread=LOCAL), reply(n)],
                             checkpoint=True)
        theirs.append_turn([NewMessage(role="user", text="stale", thread=LOCAL), reply(9)],
                           checkpoint=True)                      # written from an old view
        for n in range(5, 8):
            mine.append_turn([NewMessage(role="user", text=f"q{n}", thread=LOCAL), reply(n)],
                             checkpoint=True)
        assert theirs._stale and mine._stale          # each noticed the other one
        assert view(ThreadLog.resume(archive, LOCAL, window=3), 3) == \
            view(ThreadLog.load(archive, LOCAL), 3)
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        log.switch("main")
        cut = log.turn(3).user.timestamp
        assert forget(archive, LOCAL, before=cut) > 0
        resumed, loaded = ThreadLog.resume(archive, LOCAL, window=3), ThreadLog.load(archive, LOCAL)
        assert view(resumed, 3) == view(loaded, 3)


operations = st.lists(st.one_of(
    st.tuples(st.just("talk"), st.integers(0, 3)),
    st.tuples(st.just("fork"), st.integers(1, 30)),
    st.tuples(st.just("rewind"), st.integers(1, 30)),
    st.tuples(st.just("switch"), st.integers(0, 4)),
    st.tuples(st.just("pin"), st.integers(1, 30)),
    st.tuples(st.just("unpin"), st.integers(1, 30)),
    st.tuples(st.just("strategy"), st.integers(0, 3)),
    st.tuples(st.just("outside"), st.integers(1, 3)),
    st.tuples(st.just("summary"), st.integers(0, 1)),
    st.tuples(st.just("merge"), st.integers(0, 4)),
    st.tuples(st.just("other"), st.integers(0, 2)),
    st.tuples(st.just("checkpoint"), st.integers(0, 1)),
), min_size=1, max_size=25)
STRATEGIES = ("sliding", "forget", "summarize", "galois")


def apply(op: str, n: int, log: ThreadLog, archive: Archive, counter: int,
          others: list[ThreadLog]) -> None:
    if op == "other":                           # another process's log, loaded earlier
        if n == 0 or not others:
            others[:] = [ThreadLog.load(archive, LOCAL)]
        else:
            apply("talk", n, others[0], archive, counter, [])
        return
    turns, names = log.turn_count(), list(log.branches()) if op in ("switch", "merge") else []
    if op == "talk":
        batch = [NewMessage(role="user", text=f"q{counter}", thread=LOCAL)]
        log.append_turn(batch + [reply(counter + i) for i in range(n)], checkpoint=True)
    elif op == "fork" and log.head is not None:
        log.fork(min(n, turns))
    elif op == "rewind" and turns:
        log.rewind(min(n, turns))
    elif op == "switch":
        log.switch(names[n % len(names)])
    elif op == "merge" and names[n % len(names)] != log.branch:
        log.merge(names[n % len(names)])
    elif op in ("pin", "unpin") and turns:
        message = log.turn(min(n, turns)).ids[-1]
        log.pin(message) if op == "pin" else log.unpin(message)
    elif op == "strategy":
        log.set_strategy(STRATEGIES[n])
    elif op == "outside":                       # another writer, "auto" parents
        archive.append([NewMessage(role="user", text=f"o{counter}.{i}", thread=LOCAL)
                        for i in range(n)])
    elif op == "checkpoint":                    # by this log, or as `memory import` does
        if n == 0:
            log.write_checkpoint()
        else:
            ThreadLog.resume(archive, LOCAL, window=3).write_checkpoint()
    elif op == "summary" and log.head is not None:
        covers = tuple(log.recent_ids(3))
        entry = Entry(id="summary:s", role="system", text=f"[Summary] {counter}", turn=1,
                      kind="summary", covers=covers)
        log.keep_summary(summary_message(LOCAL, entry, strategy="summarize",
                                         branch=log.branch, turns="1"))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, window=st.integers(1, 6))
def test_resume_agrees_with_a_whole_replay_whatever_happened(ops, window):
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.fsync", lambda fd: None)
        with Archive(Path(tmp) / "memory") as archive:
            log, others = ThreadLog.load(archive, LOCAL), []
            for counter, (op, n) in enumerate([("talk", 1)] * 6 + ops):
                apply(op, n, log, archive, counter * 10, others)
            resumed = ThreadLog.resume(archive, LOCAL, window=window)
            loaded = ThreadLog.load(archive, LOCAL)
            event("resumed from the tail" if resumed._partial else "read whole")
            assert view(resumed, window) == view(loaded, window)
            assert whole(resumed) == whole(loaded)
