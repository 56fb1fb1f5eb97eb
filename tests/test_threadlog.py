"""Thread logs on real org archives: explicit parents, turns, fork/rewind/merge, pins,
control records, and the same state after a restart."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opencortex.conversation.branches import (CONTROL, MERGED_FROM, is_control, origin_of,
                                              unique)
from opencortex.conversation.entries import Entry, count_tokens, default_retention
from opencortex.conversation.threadlog import ThreadLog, UnknownMessage
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

LOCAL = Thread("cli", "local")
STRATEGY_NAMES = ("sliding", "forget", "summarize", "galois")
OTHER = Thread("telegram", "42")


def user(text: str, thread: Thread = LOCAL) -> NewMessage:
    return NewMessage(role="user", text=text, thread=thread)


def reply(text: str, thread: Thread = LOCAL, **extra: str) -> NewMessage:
    return NewMessage(role="assistant", text=text, thread=thread, extra=extra)


def talk(log: ThreadLog, label: str) -> list:
    return log.append_turn([user(f"question {label}"), reply(f"answer {label}")])


def texts(records) -> list[str]:
    return [record.text for record in records]


def snapshot(log: ThreadLog) -> tuple:
    return (log.head, log.branch, log.branches(), log.pins(),
            [r.id for r in log.ancestors()], [t.ids for t in log.turns()],
            log.branch_summaries(), log.strategy)


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as archive:
        yield archive


# -- the memory change: explicit parents ------------------------------------

def test_parent_auto_chains_after_the_last_entry(archive):
    first = archive.append([user("a")])[0]
    second, third = archive.append([user("b"), reply("c")])
    assert (first.parent, second.parent, third.parent) == (None, first.id, second.id)


def test_parent_none_and_explicit_id(archive):
    a, b = archive.append([user("a"), reply("b")])
    c = archive.append([NewMessage(role="user", text="c", thread=LOCAL, parent=None)])[0]
    d, e = archive.append([NewMessage(role="user", text="d", thread=LOCAL, parent=a.id),
                           reply("e")])
    assert c.parent is None
    assert (d.parent, e.parent) == (a.id, d.id)
    reread = {r.id: r.parent for r in archive.read_thread(LOCAL)}
    assert reread == {a.id: None, b.id: a.id, c.id: None, d.id: a.id, e.id: d.id}


def test_parent_must_exist_in_the_same_thread(archive):
    mine = archive.append([user("mine")])[0]
    theirs = archive.append([user("theirs", OTHER)])[0]
    with pytest.raises(ValueError, match="not in the archive"):
        archive.append([NewMessage(role="user", text="x", thread=LOCAL, parent="nope")])
    with pytest.raises(ValueError, match="another thread"):
        archive.append([NewMessage(role="user", text="x", thread=LOCAL, parent=theirs.id)])
    # A refused batch writes nothing, not even its valid messages.
    with pytest.raises(ValueError):
        archive.append([user("fine"), NewMessage(role="user", text="x", thread=LOCAL,
                                                 parent=theirs.id)])
    assert [r.id for r in archive.read_thread(LOCAL)] == [mine.id]


def test_parent_written_by_another_process_is_found(tmp_path):
    with Archive(tmp_path / "m") as one, Archive(tmp_path / "m") as two:
        first = one.append([user("from one")])[0]
        # `two` has not indexed it yet; the check catches up with the file first.
        second = two.append([NewMessage(role="user", text="x", thread=LOCAL, parent=first.id)])
        assert second[0].parent == first.id


def test_the_last_entry_this_process_wrote_is_a_parent_without_an_index_lookup(tmp_path,
                                                                              monkeypatch):
    """A turn's parent is usually the entry this archive just wrote at the end of the
    file: while the file still has that size it is taken as checked; once another
    process appended, the index is asked again (and still refuses a foreign parent)."""
    from opencortex.memory.index import MessageIndex
    looked: list[str] = []
    real = MessageIndex.thread_of
    monkeypatch.setattr(MessageIndex, "thread_of",
                        lambda self, id_: looked.append(id_) or real(self, id_))
    with Archive(tmp_path / "m") as one, Archive(tmp_path / "m") as two:
        last = one.append([user("first")])[-1]
        nxt = one.append([NewMessage(role="user", text="next", thread=LOCAL, parent=last.id)])
        assert looked == [] and nxt[0].parent == last.id
        two.append([user("from two")])                     # the file grew elsewhere
        again = one.append([NewMessage(role="user", text="x", thread=LOCAL,
                                       parent=nxt[0].id)])
        assert looked == [nxt[0].id] and again[0].parent == nxt[0].id
        theirs = one.append([user("theirs", OTHER)])[0]
        with pytest.raises(ValueError, match="another thread"):
            one.append([NewMessage(role="user", text="y", thread=LOCAL, parent=theirs.id)])


@pytest.mark.parametrize("bad", ["", " ", "a b", "a\nb", " x"])
def test_parent_must_be_one_word(bad):
    with pytest.raises(ValidationError):
        NewMessage(role="user", text="x", thread=LOCAL, parent=bad)


# -- entries ---------------------------------------------------------------

@pytest.mark.parametrize("text", ["ok", "thanks!", "hi", "lol", "🙂👍", "Thank you so much!",
                                  "Got it, thanks", "", "ok ok", "no problem!",
                                  "no worries"])
def test_chit_chat_is_droppable(text):
    assert default_retention("user", text, "speech") == "DROPPABLE"
    assert default_retention("assistant", text, "speech") == "DROPPABLE"


@pytest.mark.parametrize("text", ["yes", "no", "ok 42", "hi there bob", "run `ls`",
                                  "use port 8080", "we decided to ship on Friday",
                                  "thanks, also rename the file to notes.org"])
def test_content_is_required(text):
    assert default_retention("user", text, "speech") == "REQUIRED"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_numbers_and_longer_texts_are_never_chit_chat(text):
    wordy = sum(any(ch.isalpha() for ch in word) for word in text.split()) > 4
    if any(ch.isdigit() for ch in text) or wordy:
        assert default_retention("user", text, "speech") == "REQUIRED"


def test_thoughts_are_droppable_and_system_is_required():
    thought = "weighing the options carefully"
    assert default_retention("assistant", thought, "thought") == "DROPPABLE"
    assert default_retention("system", "ok", "speech") == "REQUIRED"


def test_entry_fills_tokens():
    entry = Entry(id="x", role="user", text="a" * 40, turn=1)
    assert entry.tokens == count_tokens("a" * 40) > 0
    assert Entry(id="y", role="user", text="abc", turn=1, tokens=7).tokens == 7
    assert Entry(id="s", role="system", text="s", turn=0, covers=["a", "b"]).covers == ("a", "b")
    with pytest.raises(ValueError, match="retention"):
        Entry(id="z", role="user", text="t", turn=1, retention="KEEP")


# -- turns -----------------------------------------------------------------

def test_append_turn_chains_after_the_head_in_one_write(archive, monkeypatch):
    log = ThreadLog.load(archive, LOCAL)
    calls = []
    real = archive.append
    monkeypatch.setattr(archive, "append", lambda msgs: calls.append(len(msgs)) or real(msgs))
    first = talk(log, "1")
    second = log.append_turn([user("q2"), NewMessage(role="assistant", text="t",
                                                     thread=LOCAL, turn_type="thought"),
                              reply("a2", TOKENS_IN="12", TOKENS_OUT="3", TURN="2")])
    assert calls == [2, 3]
    assert first[0].parent is None and first[1].parent == first[0].id
    assert second[0].parent == first[1].id
    assert [r.parent for r in second[1:]] == [r.id for r in second[:-1]]
    assert log.head == second[-1].id
    assert second[-1].extra == {"TOKENS_IN": "12", "TOKENS_OUT": "3", "TURN": "2"}


def test_turns_are_numbered_and_checked(archive):
    log = ThreadLog.load(archive, LOCAL)
    log.append_turn([reply("welcome")])                # before any user message
    talk(log, "1")
    talk(log, "2")
    turns = log.turns()
    assert [t.number for t in turns] == [1, 2, 3]
    assert turns[0].user is None and texts(turns[0].replies) == ["welcome"]
    assert turns[2].user.text == "question 2" and texts(turns[2].replies) == ["answer 2"]
    assert log.turn(2) == turns[1]
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match=rf"there is no turn {bad} \(this branch has 3\)"):
            log.turn(bad)


def test_turn_refuses_wrong_threads_and_control_records(archive):
    log = ThreadLog.load(archive, LOCAL)
    with pytest.raises(ValueError, match="telegram:42"):
        log.append_turn([user("x", OTHER)])
    with pytest.raises(ValueError, match="control"):
        log.append_turn([NewMessage(role="system", text="x", thread=LOCAL,
                                    extra={CONTROL: "head"})])
    with pytest.raises(ValueError, match="at least one"):
        log.append_turn([])
    assert archive.read_thread(LOCAL) == []


def test_entries_carry_turns_and_retention(archive):
    log = ThreadLog.load(archive, LOCAL)
    talk(log, "1")
    log.append_turn([user("thanks!"), reply("you're welcome")])
    records = talk(log, "3")
    log.pin(records[1].id)
    entries = log.entries()
    assert [(e.turn, e.retention) for e in entries] == [
        (1, "REQUIRED"), (1, "REQUIRED"), (2, "DROPPABLE"), (2, "REQUIRED"),
        (3, "REQUIRED"), (3, "PRESERVED")]
    assert [e.id for e in log.entries(limit=3)] == [e.id for e in entries[-3:]]
    assert all(e.kind == "message" and e.tokens > 0 for e in entries)


# -- branches ---------------------------------------------------------------

def test_fork_starts_a_branch_from_an_earlier_turn(archive):
    log = ThreadLog.load(archive, LOCAL)
    for n in range(1, 5):
        talk(log, str(n))
    main_tip = log.head
    assert log.fork(2) == "b2"
    assert log.branch == "b2" and log.head == log.turn(2).last
    talk(log, "x")
    assert texts(log.ancestors()) == ["question 1", "answer 1", "question 2", "answer 2",
                                      "question x", "answer x"]
    assert log.branches()["main"] == main_tip
    assert log.fork() == "b3" and log.head == log.branches()["b2"]
    log.switch("main")
    assert log.head == main_tip and len(log.turns()) == 4
    with pytest.raises(ValueError, match="branches: main, b2, b3"):
        log.switch("nope")


def test_fork_needs_a_message(archive):
    log = ThreadLog.load(archive, LOCAL)
    with pytest.raises(ValueError, match="nothing to branch from"):
        log.fork()


def test_rewind_keeps_later_turns_on_a_branch(archive):
    log = ThreadLog.load(archive, LOCAL)
    for n in range(1, 6):
        talk(log, str(n))
    old_head = log.head
    kept = log.rewind(2)
    assert kept == "b2" and log.branch == "main"
    assert log.head == log.turn(2).last and len(log.turns()) == 2
    assert log.branches() == {"main": log.head, "b2": old_head}
    talk(log, "new")
    assert [t.user.text for t in log.turns()] == ["question 1", "question 2", "question new"]
    assert len(archive.read_thread(LOCAL)) > 12      # nothing was deleted
    assert log.rewind(3) is None                     # already the last turn: nothing moves
    # Rewinding the kept branch keeps its own later turn on one more branch.
    log.switch("b2")
    assert log.rewind(4) == "b3"
    branches = log.branches()
    assert list(branches) == ["main", "b2", "b3"] and branches["b3"] == old_head
    assert len(log.turns()) == 4
    with pytest.raises(ValueError, match="there is no turn 9"):
        log.rewind(9)


def test_rewind_over_turns_another_branch_reaches(archive):
    log = ThreadLog.load(archive, LOCAL)
    for n in range(1, 4):
        talk(log, str(n))
    log.fork(3)                                      # b2 shares all of main
    assert log.rewind(1) == "main"                   # main still has turns 2-3
    assert list(log.branches()) == ["main", "b2"]


def test_merge_copies_the_missing_turns_once(archive):
    log = ThreadLog.load(archive, LOCAL)
    talk(log, "1")
    talk(log, "2")
    log.fork(1)
    talk(log, "b")
    log.switch("main")
    talk(log, "3")
    copies = log.merge("b2")
    assert texts(copies) == ["question b", "answer b"]
    branch_ids = [r.id for r in log.ancestors(log.branches()["b2"])]
    assert [c.extra[MERGED_FROM] for c in copies] == branch_ids[-2:]
    assert copies[0].parent == log.turn(3).last
    assert [t.user.text for t in log.turns()] == ["question 1", "question 2", "question 3",
                                                  "question b"]
    assert log.merge("b2") == []
    # Merging back the other way brings main's own turns, but not the copies of b2's.
    log.switch("b2")
    back = log.merge("main")
    assert texts(back) == ["question 2", "answer 2", "question 3", "answer 3"]
    assert log.merge("main") == []
    with pytest.raises(ValueError, match="into itself"):
        log.merge("b2")
    with pytest.raises(ValueError, match="no branch 'zz'"):
        log.merge("zz")


def test_pins_are_persisted_and_checked(archive):
    log = ThreadLog.load(archive, LOCAL)
    first = talk(log, "1")
    assert log.pin(first[0].id) is True and log.pin(first[0].id) is False
    assert log.pins() == {first[0].id}
    with pytest.raises(UnknownMessage):
        log.pin("missing")
    with pytest.raises(KeyError):
        log.record("missing")
    assert ThreadLog.load(archive, LOCAL).pins() == {first[0].id}
    assert log.unpin(first[0].id) is True and log.unpin(first[0].id) is False
    assert ThreadLog.load(archive, LOCAL).pins() == set()


def test_control_records_stay_out_of_the_conversation(archive):
    log = ThreadLog.load(archive, LOCAL)
    for n in range(1, 4):
        talk(log, str(n))
    log.fork(1)
    log.pin(log.turn(1).user.id)
    log.switch("main")
    log.rewind(2)
    everything = archive.read_thread(LOCAL)
    controls = [r for r in everything if is_control(r)]
    assert len(controls) == 6
    assert all(r.role == "system" and r.turn_type == "silence" and r.parent is None
               for r in controls)
    assert "Forked branch b2 at turn 1" in texts(controls)
    visible = {r.id for r in log.ancestors()} | {i for t in log.turns() for i in t.ids}
    visible |= {e.id for e in log.entries()}
    assert not visible & {r.id for r in controls}
    assert len(log) == 6


def test_messages_appended_outside_the_log_continue_the_current_branch(archive):
    log = ThreadLog.load(archive, LOCAL)
    talk(log, "1")
    talk(log, "2")
    log.rewind(1)                                    # the file now ends with control records
    archive.append([user("plain question"), reply("plain answer")])   # "auto" parents
    reloaded = ThreadLog.load(archive, LOCAL)
    assert texts(reloaded.ancestors()) == ["question 1", "answer 1", "plain question",
                                           "plain answer"]


def test_restart_gives_the_same_state(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        for n in range(1, 5):
            talk(log, str(n))
        log.fork(2)
        talk(log, "b")
        log.pin(log.turn(1).user.id)
        log.switch("main")
        log.rewind(3)
        log.merge("b2")
        before = snapshot(log)
    with Archive(root) as archive:
        assert snapshot(ThreadLog.load(archive, LOCAL)) == before


def test_after_loading_nothing_reads_the_archive_again(archive, monkeypatch):
    log = ThreadLog.load(archive, LOCAL)
    for n in range(1, 4):
        talk(log, str(n))
    log = ThreadLog.load(archive, LOCAL)

    def no_reading(*args, **kwargs):
        raise AssertionError("the archive was read again")

    for name in ("read_thread", "history", "search"):
        monkeypatch.setattr(archive, name, no_reading)
    talk(log, "4")
    assert len(log.ancestors()) == 8 and len(log.turns()) == 4
    log.fork(2)
    log.rewind(1)
    log.merge("main")
    log.entries()


def test_branch_summaries_name_every_branch_with_its_size(archive):
    log = ThreadLog.load(archive, LOCAL)
    assert log.branch_summaries() == [{"name": "main", "head_turn": 0, "turns": 0,
                                       "current": True, "head": None}]
    for n in range(1, 4):
        talk(log, str(n))
    log.fork(1)
    talk(log, "b")
    log.start_afresh()
    rows = {row["name"]: row for row in log.branch_summaries()}
    assert list(rows) == ["main", "b2", "b3"]
    assert (rows["main"]["turns"], rows["main"]["head_turn"]) == (3, 3)
    assert (rows["b2"]["turns"], rows["b2"]["head"]) == (2, log.branches()["b2"])
    assert rows["b3"] == {"name": "b3", "head_turn": 0, "turns": 0, "current": True,
                          "head": None}
    assert [row["current"] for row in rows.values()] == [False, False, True]


def test_reaches_tells_whether_a_message_is_on_a_branch(archive):
    log = ThreadLog.load(archive, LOCAL)
    first = talk(log, "1")
    talk(log, "2")
    log.rewind(1)
    later = log.branches()["b2"]
    assert log.reaches("main", first[-1].id) and log.reaches("b2", first[-1].id)
    assert log.reaches("b2", later) and not log.reaches("main", later)
    assert log.reaches("main", None)
    with pytest.raises(ValueError, match="no branch 'zz'"):
        log.reaches("zz", None)


def test_the_strategy_is_a_control_record_kept_across_a_restart(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        assert log.strategy is None
        talk(log, "1")
        assert log.set_strategy("galois") is True and log.set_strategy("galois") is False
        talk(log, "2")
        assert len(log.turns()) == 2                 # the record is not a turn
    with Archive(root) as archive:
        again = ThreadLog.load(archive, LOCAL)
        assert again.strategy == "galois"
        records = [r for r in archive.read_thread(LOCAL) if is_control(r)]
        assert [r.extra[CONTROL] for r in records] == ["strategy"]
        assert records[0].text == "Compression strategy galois"


def test_unique_folds_merged_copies_into_their_origin(archive):
    log = ThreadLog.load(archive, LOCAL)
    talk(log, "1")
    log.fork(1)
    branch = talk(log, "b")
    log.switch("main")
    copies = log.merge("b2")
    found = archive.search("b", thread=LOCAL, limit=10)
    assert len(found) == 4                          # originals and copies are both indexed
    once = unique(found)
    assert sorted(origin_of(r) for r in once) == sorted(r.id for r in branch)
    assert unique([*copies, *branch]) == copies     # the first seen stands for the message
    assert unique(branch, seen=[branch[0].id]) == branch[1:]
    assert unique(copies, seen=[branch[0].id]) == copies[1:]


# -- property: any sequence of branch operations ----------------------------

operations = st.lists(st.one_of(
    st.tuples(st.just("talk"), st.integers(0, 2)),
    st.tuples(st.just("fork"), st.integers(1, 12)),
    st.tuples(st.just("rewind"), st.integers(1, 12)),
    st.tuples(st.just("merge"), st.integers(0, 5)),
    st.tuples(st.just("switch"), st.integers(0, 5)),
    st.tuples(st.just("pin"), st.integers(1, 12)),
    st.tuples(st.just("strategy"), st.integers(0, 3)),
), min_size=1, max_size=20)
# Every sequence starts from three diverged branches, so merges have something to copy.
DIVERGED = [("talk", 1), ("talk", 0), ("fork", 1), ("talk", 1), ("switch", 0), ("talk", 2),
            ("rewind", 2), ("talk", 1)]


def check_no_duplicates(log: ThreadLog) -> None:
    """Along every branch, each message (or copy of it) appears at most once."""
    for tip in log.branches().values():
        if tip is None:
            continue
        path = log.ancestors(tip)
        origins = [origin_of(r) for r in path]
        assert len(origins) == len(set(origins)), "a merge duplicated a message"
        assert not any(is_control(r) for r in path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_branch_operations_never_duplicate_and_survive_a_restart(ops):
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.fsync", lambda fd: None)      # durability is not under test here
        root = Path(tmp) / "memory"
        counter = 0
        with Archive(root) as archive:
            log = ThreadLog.load(archive, LOCAL)
            for op, n in DIVERGED + ops:
                turns = len(log.turns())
                names = list(log.branches())
                if op == "talk":
                    counter += 1
                    log.append_turn([user(f"q{counter}")] + [reply(f"a{counter}.{i}")
                                                             for i in range(n)])
                elif op == "fork" and log.head is not None:
                    log.fork(min(n, turns))
                elif op == "rewind" and turns:
                    log.rewind(min(n, turns))
                elif op == "merge" and names[n % len(names)] != log.branch:
                    other = names[n % len(names)]
                    theirs = {origin_of(r) for r in log.ancestors(log.branches()[other])
                              } if log.branches()[other] else set()
                    event("merge copied messages" if log.merge(other) else "empty merge")
                    assert theirs <= {origin_of(r) for r in log.ancestors()}
                    assert log.merge(other) == []
                elif op == "switch":
                    log.switch(names[n % len(names)])
                elif op == "pin" and turns:
                    log.pin(log.turn(min(n, turns)).ids[-1])
                elif op == "strategy":
                    log.set_strategy(STRATEGY_NAMES[n])
                    assert log.strategy == STRATEGY_NAMES[n]
                check_no_duplicates(log)
            before = snapshot(log)
        with Archive(root) as archive:
            assert snapshot(ThreadLog.load(archive, LOCAL)) == before
