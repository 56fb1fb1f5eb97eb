"""Recall scoped by owner, and the archive's search over several threads."""

from __future__ import annotations

import os
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencortex.conversation import recall as recall_module
from opencortex.conversation.entries import Entry
from opencortex.conversation.recall import LOCAL_OWNER, Recall, owner_of
from opencortex.conversation.recallwords import recall_query
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory import index as index_module
from opencortex.memory import partitions
from opencortex.memory import ranking

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "main")
ALICE = Thread("telegram", "1001")          # a Telegram user
BOB = Thread("telegram", "1002")            # another Telegram user
GROUP = Thread("telegram", "-100777")       # a Telegram group
ROOM = Thread("matrix", "!room:example.org")
THREADS = (CLI, EMACS, ALICE, BOB, GROUP, ROOM)


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


def say(text: str, thread: Thread, role: str = "user", **fields) -> NewMessage:
    return NewMessage(role=role, text=text, thread=thread, **fields)


def control(thread: Thread, target: str, text: str) -> NewMessage:
    """A control record as the thread log writes them (branch/head/pin bookkeeping)."""
    return NewMessage(role="system", text=text, thread=thread, turn_type="silence",
                      parent=None, extra={"CONTROL": "pin", "TARGET": target, "BRANCH": "main"})


# -- owners -------------------------------------------------------------------------


def test_owner_is_the_configured_name_else_local_else_the_thread():
    assert owner_of(CLI, {}) == owner_of(EMACS, {}) == LOCAL_OWNER == "local"
    assert owner_of(Thread("emacs", "notes"), {}) == "local"
    assert owner_of(ALICE, {}) == "telegram:1001"
    assert owner_of(GROUP, {}) == "telegram:-100777"
    assert owner_of(ROOM, {}) == "matrix:!room:example.org"
    owners = {"telegram:1001": "alice", "signal:+4912345": "local"}
    assert owner_of(ALICE, owners) == "alice"
    assert owner_of(Thread("signal", "+4912345"), owners) == "local"
    assert owner_of(BOB, owners) == "telegram:1002"
    assert owner_of(CLI, {"cli:local": "me"}) == "me"


def test_threads_of_groups_the_archive_by_owner(archive):
    for thread in THREADS:
        archive.append([say(f"hello from {thread}", thread)])
    recall = Recall(archive, {"telegram:1002": "local"})
    assert recall.threads_of("local") == sorted([CLI, EMACS, BOB])
    assert recall.threads_of("telegram:1001") == [ALICE]
    assert recall.threads_of("telegram:-100777") == [GROUP]
    assert recall.threads_of("nobody") == []


def age(root: Path) -> None:
    """Make the archive's directories look untouched for an hour."""
    hour_ago = time.time() - 3600
    for directory in [root, *(p for p in root.iterdir() if p.is_dir())]:
        os.utime(directory, (hour_ago, hour_ago))


def test_threads_of_notices_a_new_thread_without_rereading_otherwise(archive, monkeypatch):
    archive.append([say("first", CLI)])
    recall = Recall(archive, {})
    calls = []
    real = archive.threads
    monkeypatch.setattr(archive, "threads", lambda: calls.append(1) or real())
    assert recall.threads_of("local") == [CLI]       # directories just changed: not trusted
    assert len(calls) == 1
    archive.append([say("second", EMACS)])
    assert recall.threads_of("local") == [CLI, EMACS]
    age(archive.root)
    recall.threads_of("local")
    calls.clear()
    assert recall.threads_of("local") == [CLI, EMACS]
    recall.recall(CLI, "first")
    assert calls == []                               # nothing changed: nothing re-read
    archive.append([say("third", Thread("cli", "other"))])
    assert recall.threads_of("local") == [CLI, Thread("cli", "other"), EMACS]
    assert len(calls) == 1


def test_a_thread_another_process_made_is_noticed_within_the_recheck_time(archive,
                                                                          monkeypatch):
    """This archive's new threads are noticed at once; the directories are looked at
    for others' (another process's archive) at most every RECHECK_NS, not per recall."""
    archive.append([say("first", CLI)])
    age(archive.root)
    recall = Recall(archive, {})
    assert recall.threads_of("local") == [CLI]
    stamps = []
    real = recall._directory_stamp
    monkeypatch.setattr(recall, "_directory_stamp", lambda: stamps.append(1) or real())
    for _ in range(5):
        recall.recall(CLI, "first")
    assert stamps == []                              # looked at recently: not again
    with Archive(archive.root) as other:             # as another process would
        other.append([say("elsewhere", EMACS)])
    monkeypatch.setattr(recall_module, "RECHECK_NS", 0)
    assert recall.threads_of("local") == [CLI, EMACS]
    assert len(stamps) == 1


# -- recall -------------------------------------------------------------------------


def test_recall_brings_back_same_owner_messages_marked_as_recalled(archive):
    stamp = datetime(2026, 11, 2, 15, 30).timestamp()
    [fact] = archive.append([say("the staging database listens on port 5433", CLI,
                                 timestamp=stamp)])
    archive.append([say("unrelated talk about gardening", CLI)])
    entries = Recall(archive, {}).recall(EMACS, "which port does the staging database use?")
    assert entries == [Entry(
        id=fact.id, role="user", turn=0, retention="DROPPABLE", kind="recalled",
        text="[recalled from cli:local, 2026-11-02, user] "
             "the staging database listens on port 5433")]
    assert entries[0].tokens > 0


def test_recall_never_crosses_owners_unless_shared(archive):
    archive.append([say("deploy key rotation schedule", CLI)])
    archive.append([say("deploy party on friday", GROUP)])
    archive.append([say("deploy my cat pictures", ALICE)])
    recall = Recall(archive, {})
    assert [e.text.split("] ")[1] for e in recall.recall(GROUP, "deploy")] == [
        "deploy party on friday"]
    assert [e.text.split("] ")[1] for e in recall.recall(ALICE, "deploy")] == [
        "deploy my cat pictures"]
    assert [e.text.split("] ")[1] for e in recall.recall(BOB, "deploy")] == []
    assert [e.text.split("] ")[1] for e in recall.recall(EMACS, "deploy")] == [
        "deploy key rotation schedule"]
    shared = Recall(archive, {}, shared_owners=["local"])
    assert sorted(e.text.split("] ")[1] for e in shared.recall(GROUP, "deploy")) == [
        "deploy key rotation schedule", "deploy party on friday"]
    assert sorted(e.text.split("] ")[1] for e in shared.recall(EMACS, "deploy")) == [
        "deploy key rotation schedule"]


def test_recall_work_does_not_grow_with_the_owners_number_of_threads(tmp_path, monkeypatch):
    """Years of Emacs chats are thousands of threads of one owner: recall searches the
    owner's table whole, with no lookup, filter or check per thread (each hit is
    still checked), so 300 messages in 300 threads cost what they cost in 3.  Before, it
    cost about 2.7 ms at 1,000 threads and 17 ms at 5,000 (bench_recall.py)."""
    from opencortex.memory import partitions, records
    looked: list[str] = []
    monkeypatch.setattr(records, "check_thread", lambda *a, _f=records.check_thread: (
        looked.append("check_thread"), _f(*a))[1])
    monkeypatch.setattr(partitions.Partitions, "known_table", lambda self, t, _f=partitions.
                        Partitions.known_table: (looked.append("known_table"), _f(self, t))[1])

    def recall_work(threads: int) -> tuple[int, list[str]]:
        with Archive(tmp_path / f"memory-{threads}") as archive:
            archive.append([say(f"pelican note {i} with words" + " heron" * (i % 10 == 0),
                                Thread("emacs", f"chat{i % threads}")) for i in range(300)] +
                           [say("pelican heron secret of someone else", ALICE)])
            recall = Recall(archive, {})
            statements: list[str] = []
            with archive._readers.reading() as reader:
                for index in (reader, archive._index):
                    index._db.set_trace_callback(lambda sql: sql.startswith("--") or
                                                 statements.append(sql))  # ours, not FTS5's
            recall.recall(EMACS, "pelican heron")           # warm: counts and tables
            statements.clear()
            looked.clear()
            found = recall.recall(EMACS, "pelican heron")
            assert len(found) == 5
            assert not any("someone else" in e.text for e in found)
            return len(statements), list(looked)
    few, many = recall_work(3), recall_work(300)
    assert many == few and few[1] == []


def test_recall_honours_k_exclusions_and_empty_queries(archive):
    records = archive.append([say(f"kiwi fact number {i}", CLI) for i in range(8)])
    recall = Recall(archive, {})
    assert len(recall.recall(CLI, "kiwi", k=3)) == 3
    assert recall.recall(CLI, "kiwi", k=0) == []
    assert recall.recall(CLI, "   ") == []
    kept = {e.id for e in recall.recall(CLI, "kiwi", k=8, exclude_ids=[r.id for r in records[:5]])}
    assert kept == {r.id for r in records[5:]}


def test_recall_leaves_out_function_words_and_control_records(archive):
    [note] = archive.append([say("what is the plan for the launch", CLI)])
    archive.append([say("what is it", CLI)])
    archive.append([control(CLI, note.id, "Pinned the launch message")])
    texts = [e.text for e in Recall(archive, {}).recall(CLI, "what is the launch?")]
    assert len(texts) == 1 and texts[0].endswith("what is the plan for the launch")
    assert recall_query("what is the launch?") == "launch?"
    # Only function words name nothing to match: "what is it" recalled "what is it" and
    # the like at a score of 0 (noise); it recalls nothing now.
    assert recall_query("what is it") == ""
    assert Recall(archive, {}).recall(CLI, "what is it?") == []
    assert "searched for: nothing" in Recall(archive, {}).explain(CLI, "what is it?")


def test_a_word_joined_by_a_slash_or_colon_finds_its_parts_after_the_whole(archive):
    """"TCP/IP" was searched only as the phrase "tcp ip": a message saying "TCP" alone
    was never recalled.  The whole comes first (it matches the parts too), then a
    message naming one part; numbers, function words and a link's scheme are no parts
    ("10:30" does not recall every "10", "and/or" every "and")."""
    archive.append([say(text, CLI, timestamp=1.7e9 + n) for n, text in enumerate((
        "the TCP/IP stack was rewritten in the spring",
        "TCP handshakes time out behind the VPN",
        "dinner is at 10 and the film starts 30 minutes later",
        "the standup moved to 10:30",
        "either or, the choice is yours",
        "the client/server split goes into kernel/opencortex/memory",
        "https links and more links"))])
    recall = Recall(archive, {})

    def texts(question: str) -> list[str]:
        return [e.text.split("] ", 1)[1] for e in recall.recall(EMACS, question, k=5)]

    assert texts("what about the TCP/IP thing?") == [
        "the TCP/IP stack was rewritten in the spring", "TCP handshakes time out behind the VPN"]
    assert texts("when is the 10:30 meeting?") == ["the standup moved to 10:30"]
    assert texts("either/or?") == ["either or, the choice is yours"]
    assert texts("and/or") == []
    assert texts("where does the server code live?") == [
        "the client/server split goes into kernel/opencortex/memory"]
    assert texts("what is in https://example.org/memory?") == [
        "the client/server split goes into kernel/opencortex/memory"]
    assert recall_query("the TCP/IP thing, at 10:30 and/or https://x.org/a/b/c/d/e") == (
        "TCP/IP TCP IP thing, 10:30 and/or https://x.org/a/b/c/d/e x.org")
    assert "searched for: TCP/IP TCP IP thing?" in recall.explain(EMACS, "the TCP/IP thing?")


def test_long_recalled_messages_are_cut(archive):
    archive.append([say("marker " + "x" * 5000, CLI)])
    [entry] = Recall(archive, {}, max_chars=100).recall(CLI, "marker")
    assert entry.text.endswith(" …") and len(entry.text) < 200


def test_recall_survives_a_restart(tmp_path):
    with Archive(tmp_path / "memory") as archive:
        archive.append([say("persistent walrus fact", CLI), say("walrus in a group", GROUP)])
    with Archive(tmp_path / "memory") as archive:
        texts = [e.text for e in Recall(archive, {}).recall(EMACS, "walrus")]
    assert len(texts) == 1 and texts[0].endswith("persistent walrus fact")


# -- the canary property --------------------------------------------------------------

OWNERS = {"signal:+4900": "local"}          # a bridge thread the owner mapped to himself
CANARY_THREADS = (CLI, EMACS, ALICE, BOB, GROUP, ROOM, Thread("signal", "+4900"))
FILLER = ("project meeting notes", "budget and launch plan", "see you at the meeting")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(st.tuples(st.sampled_from(CANARY_THREADS), st.sampled_from(FILLER),
                               st.booleans()), min_size=1, max_size=20),
       shared=st.booleans(), crowded=st.booleans())
def test_recall_never_returns_another_owners_canary(plan, shared, crowded):
    """Two Telegram users, a group, a Matrix room and the local user (Emacs, terminal and a
    Signal chat mapped to them) write canaries in any order; recall never crosses owners.
    CROWDED: owners past the first share one FTS table, and one that reaches three
    messages moves to a table of its own (see `partitions`)."""
    shared_owners = ["telegram:-100777"] if shared else []
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        if crowded:
            for name, value in (("OWN_TABLES", 1), ("SHARED_TABLES", 1), ("OWN_FROM", 3),
                                ("GROWTH_CHECK", 1)):
                patch.setattr(partitions, name, value)
        _canaries_stay_with_their_owner(Path(tmp), plan, shared_owners)


def _canaries_stay_with_their_owner(tmp: Path, plan, shared_owners: list[str]) -> None:
    """Archive PLAN's canaries under TMP; check what each thread recalls."""
    with Archive(tmp / "memory") as archive:
        canaries: dict[str, Thread] = {}
        for n, (thread, filler, with_reply) in enumerate(plan):
            canary = f"canary{n:03d}"
            canaries[canary] = thread
            messages = [say(f"{filler} {canary}", thread)]
            if with_reply:                       # a reply sharing the words, without the canary
                messages.append(say(f"noted: {filler}", thread, role="assistant"))
            archive.append(messages)
        recall = Recall(archive, OWNERS, shared_owners)

        def visible(asking: Thread, origin: Thread) -> bool:
            return (owner_of(origin, OWNERS) == owner_of(asking, OWNERS)
                    or owner_of(origin, OWNERS) in shared_owners)

        for asking in CANARY_THREADS:
            own = {c for c, origin in canaries.items() if visible(asking, origin)}
            for canary in canaries:
                found = recall.recall(asking, f"{canary} {FILLER[0]}", k=5)
                leaked = {c for c in canaries if any(c in e.text for e in found)} - own
                assert not leaked, f"{asking} recalled {leaked}"
                exact = recall.recall(asking, canary, k=1)
                if canary in own:
                    assert len(exact) == 1 and exact[0].text.endswith(canary)
                else:
                    assert exact == []
            everything = " ".join(list(canaries) + list(FILLER))   # <= 32 words after stopwords
            texts = " ".join(e.text for e in recall.recall(asking, everything, k=len(plan) * 2))
            assert {c for c in canaries if c in texts} == own


# -- the archive's search over several threads -----------------------------------------


def test_search_over_several_threads(archive):
    for thread in (CLI, EMACS, ALICE, GROUP):
        archive.append([say(f"otter sighting in {thread}", thread)])

    def where(**scope) -> set[Thread]:
        return {hit.thread for hit in archive.search("otter", **scope)}

    assert where() == {CLI, EMACS, ALICE, GROUP}
    assert where(threads=[CLI, EMACS]) == {CLI, EMACS}
    assert where(threads=[ALICE], thread=GROUP) == {ALICE, GROUP}
    assert where(threads=[BOB]) == set()
    assert where(threads=[]) == set()
    assert where(thread=EMACS) == {EMACS}
    with pytest.raises(TypeError, match="thread="):
        archive.search("otter", threads=CLI)
    with pytest.raises(ValueError, match="channel"):
        archive.search("otter", threads=[Thread("Bad Channel", "x")])


def test_search_excludes_ids_and_still_fills_the_limit(archive):
    records = archive.append([say(f"heron {i}", CLI) for i in range(6)])
    excluded = [r.id for r in records[:4]]
    hits = archive.search("heron", limit=2, exclude_ids=excluded)
    assert len(hits) == 2 and not {h.id for h in hits} & set(excluded)
    with pytest.raises(TypeError):
        archive.search("heron", exclude_ids=records[0].id)


def test_control_records_are_never_found(archive):
    [message] = archive.append([say("a message about llamas", CLI)])
    archive.append([control(CLI, message.id, "Pinned the llamas message")])
    assert [h.id for h in archive.search("llamas")] == [message.id]
    assert archive.search("pinned") == []
    archive.reindex()
    assert archive.search("pinned") == []


def test_search_words_match_the_text_not_the_thread_column(archive):
    archive.append([say("plain words", CLI)])
    token = index_module.thread_token(CLI)
    assert archive.search(token) == []


def test_very_common_words_are_left_out_while_rarer_ones_remain(archive, monkeypatch):
    monkeypatch.setattr(ranking, "COMMON_DOCS", 3)
    archive.append([say(f"the weather report {i}", CLI) for i in range(6)])
    [rare] = archive.append([say("the zebra crossing", CLI)])
    assert [h.id for h in archive.search("the zebra")] == [rare.id]
    newest = archive.search("the", limit=3)        # only common words: the newest matches
    assert [h.text for h in newest] == ["the zebra crossing", "the weather report 5",
                                        "the weather report 4"]
    assert [h.text for h in archive.search("the", thread=EMACS)] == []


def test_frequent_word_counts_are_reused_until_the_table_grew_and_rare_ones_counted_anew(
        archive, monkeypatch):
    """Counting a frequent word costs time per message: its count is reused (until the
    table grew by an eighth of it); a word counted rare or not found is counted again
    once anything was written (so a message written just before a search is found by
    it), and reused until then (the several searches of one recall counted it each)."""
    monkeypatch.setattr(ranking, "COUNTED_FROM", 4)
    monkeypatch.setattr(ranking, "SIZE_TTL", 0.0)      # the table's size is read each time
    archive.append([say(f"kettle number {i}", CLI) for i in range(16)])
    counted: list[str] = []
    with archive._readers.reading() as reader:     # the connections searches may read through
        for index in (reader, archive._index):
            index._db.set_trace_callback(lambda sql: counted.append(sql) if "LIMIT" in sql
                                         and "count(*)" in sql else None)

    def counts(query: str) -> int:
        counted.clear()
        archive.search(query, thread=CLI)
        return len(counted)
    assert counts("kettle teapot") == 2       # both counted the first time
    assert counts("kettle teapot") == 0       # 16 kettles: reused; no teapot: nothing written
    [teapot] = archive.append([say("the teapot", CLI)])
    counted.clear()
    assert [h.id for h in archive.search("teapot", thread=CLI)] == [teapot.id]
    assert len(counted) == 1                  # written since: counted again, and found
    writing = archive._index                  # searched through the connection that writes
    assert writing.search("saucer", None, 5) == []
    [saucer] = archive.append([say("the saucer", CLI)])
    assert [h.id for h in writing.search("saucer", None, 5)] == [saucer.id]
    archive.append([say(f"kettle again {i}", CLI) for i in range(2)])
    assert counts("kettle") == 1              # grew by 3 of 16 (>= 16 // 8): counted again
    assert counts("kettle") == 0


def test_a_ranked_search_past_its_time_limit_falls_back_to_newest_matches(archive, monkeypatch):
    archive.append([say(f"owl number {i}", CLI) for i in range(30)])
    archive.append([say("owl elsewhere", GROUP)])
    monkeypatch.setattr(ranking, "SEARCH_TIME_LIMIT", -1.0)   # already past
    monkeypatch.setattr(ranking, "PROGRESS_STEPS", 1)
    hits = archive.search("owl", thread=CLI, limit=3)
    assert [h.text for h in hits] == ["owl number 29", "owl number 28", "owl number 27"]


def test_only_the_rarest_words_within_the_match_budget_are_ranked(archive, monkeypatch):
    monkeypatch.setattr(ranking, "MATCH_BUDGET", 2)
    [rare] = archive.append([say("alpha and beta", CLI)])
    archive.append([say(f"beta number {i}", CLI) for i in range(3)])
    assert [h.id for h in archive.search("beta alpha")] == [rare.id]
    assert len(archive.search("beta")) == 4          # the rarest word is always kept


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(["kite", "kite kite", "kite wind", "wind"]),
                      min_size=1, max_size=12),
       excluded=st.sets(st.integers(0, 11)), limit=st.integers(1, 6))
def test_search_with_exclusions_is_the_full_ranking_without_them(words, excluded, limit):
    """Matches are read only until LIMIT are kept; what is kept is what ranking them all
    and then leaving out the excluded ids would keep; with CANDIDATES, the first LIMIT
    of a search for that many."""
    with tempfile.TemporaryDirectory() as tmp, Archive(Path(tmp)) as archive:
        records = archive.append([say(text, CLI if i % 3 else GROUP)
                                  for i, text in enumerate(words)])
        exclude = {records[i].id for i in excluded if i < len(records)}
        every = archive.search("kite", threads=[CLI, GROUP], limit=100)
        hits = archive.search("kite", threads=[CLI, GROUP], limit=limit, exclude_ids=exclude)
        assert hits == [hit for hit in every if hit.id not in exclude][:limit]
        fewer = archive.search("kite", threads=[CLI, GROUP], limit=limit - 1 or 1,
                               exclude_ids=exclude, candidates=limit)
        assert fewer == hits[:limit - 1 or 1]


def test_a_search_stopped_early_ends_its_read(archive):
    """A search that stops reading matches once it has enough leaves no read open: the
    writer can then checkpoint its whole log."""
    others = archive.append([say(f"tern {i}", CLI) for i in range(5)])
    archive.append([say(f"gull {i}", CLI) for i in range(20)])
    excluded = [record.id for record in others]     # room for 7 matches, 2 are read
    assert len(archive.search("gull", limit=2, exclude_ids=excluded)) == 2
    writer = archive._index._db
    busy, _, _ = writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0
