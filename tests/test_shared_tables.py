"""Owners past OWN_TABLES share FTS tables, and get their own when they grow: strangers
on a bridge cannot grow the index's schema without end (every opening of the index
reads it whole: 3,000 owners made each start of opencortex 0.65 s slower per
connection, 10,000 about 40 s per command)."""

from __future__ import annotations

import sqlite3

import pytest

from opencortex.conversation.recall import Recall
from opencortex.events import Thread
from opencortex.memory import Archive, partitions
from opencortex.memory.index import SCHEMA_VERSION

from test_recall import CLI, EMACS, say

STRANGERS = [Thread("telegram", str(5000 + n)) for n in range(40)]


def fts_tables(root) -> list[str]:
    db = sqlite3.connect(root / "index.sqlite")
    try:
        return [name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL%'")]
    finally:
        db.close()


@pytest.fixture
def crowded(monkeypatch):
    """Two owners get tables of their own; later ones share three tables."""
    monkeypatch.setattr(partitions, "OWN_TABLES", 2)
    monkeypatch.setattr(partitions, "SHARED_TABLES", 3)


def test_owners_past_the_first_share_a_few_tables(tmp_path, crowded):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        archive.append([say("local walrus notes", CLI)])
        for n, thread in enumerate(STRANGERS):
            archive.append([say(f"walrus sighting number{n}", thread)])
    tables = fts_tables(root)
    own = [t for t in tables if not partitions.is_shared(t)]
    assert len(own) == 2 and len(tables) <= 2 + 3
    with Archive(root) as archive:
        recall = Recall(archive, {})
        for n, thread in enumerate(STRANGERS):
            found = [e.text for e in recall.recall(thread, "walrus sighting", k=5)]
            assert len(found) == 1 and found[0].endswith(f"number{n}")
        assert [e.text.rsplit("] ", 1)[1] for e in recall.recall(EMACS, "walrus")] == [
            "local walrus notes"]


def test_a_sharing_owner_is_ranked_among_its_own_messages_only(tmp_path, crowded,
                                                               monkeypatch):
    """A stranger's search in a shared table filters by their threads: another
    sharer's many matches never fill the hits, and who they name is not a sender of
    theirs."""
    monkeypatch.setattr(partitions, "SHARED_TABLES", 1)
    alice, mallory = STRANGERS[10], STRANGERS[11]
    with Archive(tmp_path / "memory") as archive:
        archive.append([say("filler", CLI), say("filler", STRANGERS[0])])
        archive.append([say(f"the password is hunter{n}", mallory, sender="Mallory")
                        for n in range(30)])
        [mine] = archive.append([say("my password hint is a bird", alice, sender="Alice")])
        parts = archive._index._parts
        assert parts.table_of(alice) == parts.table_of(mallory)
        assert partitions.is_shared(parts.table_of(alice))
        recall = Recall(archive, {})
        assert [e.id for e in recall.recall(alice, "what is the password?", k=5)] == [mine.id]
        assert archive.speakers("what did Mallory say?", owners=["telegram:5010"]) == []
        assert archive.speakers("what did Mallory say?", owners=["telegram:5011"]) == [
            "Mallory"]


def test_an_owner_that_grows_gets_a_table_of_its_own(tmp_path, crowded, monkeypatch):
    monkeypatch.setattr(partitions, "OWN_FROM", 12)
    monkeypatch.setattr(partitions, "GROWTH_CHECK", 4)
    root = tmp_path / "memory"
    talker, quiet = STRANGERS[20], STRANGERS[21]
    with Archive(root) as archive:
        archive.append([say("filler", CLI), say("filler", STRANGERS[0])])
        archive.append([say("heron note of the quiet one", quiet, sender="Quinn")])
        index = archive._index
        assert partitions.is_shared(index._parts.table_of(talker))
        with archive._readers.reading() as reader:      # a reader that knew the old table
            assert reader.search("heron", [talker], 5) == []
        for n in range(12):
            archive.append([say(f"heron fact {n}", talker, sender="Tess")])
        table = index._parts.table_of(talker)
        assert not partitions.is_shared(table)
        assert partitions.is_shared(index._parts.table_of(quiet))
        with archive._readers.reading() as reader:
            assert len(reader.search("heron", None, 50, owners=[str(talker)])) == 12
            assert [h.text for h in reader.search("heron", None, 50, owners=[str(quiet)])] == [
                "heron note of the quiet one"]
        assert archive.speakers("what did Tess say?", owners=[str(talker)]) == ["Tess"]
        assert archive.speakers("what did Tess say?", owners=[str(quiet)]) == []
        assert archive.speakers("what did Quinn say?", owners=[str(quiet)]) == ["Quinn"]
    with Archive(root) as archive:                        # the move survives a restart
        assert not partitions.is_shared(archive._index._parts.table_of(talker))
        assert len(archive.search("heron", thread=talker, limit=50)) == 12


def test_an_index_of_layout_4_is_upgraded_in_place(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        archive.append([say("the donated piano", CLI, sender="Caroline")])
        archive.append([say("stranger piano", STRANGERS[0])])
    _make_layout_4(root)
    with Archive(root) as archive:
        assert archive._index.count() == 2            # kept, not rebuilt
        assert [h.text for h in archive.search("donate", thread=CLI)] == ["the donated piano"]
        archive.append([say("new piano", STRANGERS[1])])
        assert len(archive.search("piano")) == 3
    db = sqlite3.connect(root / "index.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_an_index_of_layout_4_with_many_owners_is_rebuilt_into_shared_tables(
        tmp_path, monkeypatch):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        for thread in STRANGERS:
            archive.append([say("an owl", thread)])
    assert len(fts_tables(root)) == len(STRANGERS)
    _make_layout_4(root)
    monkeypatch.setattr(partitions, "OWN_TABLES", 5)
    monkeypatch.setattr(partitions, "SHARED_TABLES", 2)
    with Archive(root) as archive:
        assert len(archive.search("owl", limit=100)) == len(STRANGERS)
    assert len(fts_tables(root)) <= 5 + 2


def _make_layout_4(root) -> None:
    """Turn the index under ROOT into one of layout 4: parts.tab unique, no indexes of
    the partitions."""
    db = sqlite3.connect(root / "index.sqlite")
    db.executescript("""
        DROP INDEX parts_in_table; DROP INDEX threads_of_part;
        CREATE TABLE parts_4 (name TEXT PRIMARY KEY, tab INTEGER NOT NULL UNIQUE);
        INSERT INTO parts_4 SELECT name, tab FROM parts; DROP TABLE parts;
        ALTER TABLE parts_4 RENAME TO parts; PRAGMA user_version = 4;""")
    db.close()


def test_a_connection_remembers_a_bounded_number_of_threads_tables(tmp_path, crowded,
                                                                   monkeypatch):
    """Which table each thread is in was remembered for every thread ever met, by every
    connection: strangers' threads come without end."""
    monkeypatch.setattr(partitions, "MAX_REMEMBERED", 5)
    with Archive(tmp_path / "memory") as archive:
        for n, thread in enumerate(STRANGERS):
            archive.append([say(f"kestrel number{n}", thread)])
        parts = archive._index._parts
        assert len(parts._placed) <= 5
        for n, thread in enumerate(STRANGERS):
            assert [h.text for h in archive.search("kestrel", thread=thread)] == [
                f"kestrel number{n}"]
        assert len(parts._placed) <= 5
