"""Named sessions in memory/sessions.org: save, get, list, search, scoped by owner."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orgparse
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.conversation.saved import (MAX_NAME, SavedSession, SavedSessions, check_name,
                                           parse_saves)
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "main")
ALICE = Thread("telegram", "1001")
GROUP = Thread("telegram", "-100777")


@pytest.fixture
def root(tmp_path):
    return tmp_path / "memory"


def test_save_get_and_list_survive_a_restart(root):
    sessions = SavedSessions(root)
    stored = sessions.save("parser work", CLI, "main", "id-1", "Reader errors")
    assert stored.owner == "local" and stored.head == "id-1"
    sessions.save("deploy", EMACS, "b2", "id-2")
    again = SavedSessions(root)
    assert again.get("parser work") == stored
    assert [s.name for s in again.list()] == ["deploy", "parser work"]     # newest first
    assert again.get("nothing saved") is None
    assert (root / "sessions.org").exists()


def test_a_later_save_of_the_same_name_wins_and_names_ignore_case(root):
    sessions = SavedSessions(root)
    sessions.save("Work", CLI, "main", "id-1", "first")
    sessions.save("work", CLI, "b3", "id-9", "second")
    [latest] = sessions.list()
    assert (latest.name, latest.branch, latest.head, latest.title) == ("work", "b3", "id-9",
                                                                       "second")
    assert sessions.get("WORK") == latest
    assert len(parse_saves((root / "sessions.org").read_text())) == 2     # append-only


def test_an_empty_branch_saves_without_a_head(root):
    sessions = SavedSessions(root)
    sessions.save("blank", CLI, "main", None)
    assert SavedSessions(root).get("blank").head is None


def test_names_are_one_short_line(root):
    sessions = SavedSessions(root)
    assert check_name("  padded  ") == "padded"
    assert sessions.save("x" * MAX_NAME, CLI, "main", None).name == "x" * MAX_NAME
    for bad in ("", "   ", "two\nlines", "tab\tinside", "x" * (MAX_NAME + 1), "nul\0",
                "sep\u2028arator"):
        with pytest.raises(ValueError):
            sessions.save(bad, CLI, "main", None)
    with pytest.raises(TypeError):
        sessions.save(None, CLI, "main", None)
    for branch, head in (("", None), ("two words", None), ("main", "a b"), ("main", "")):
        with pytest.raises(ValueError):
            sessions.save("ok", CLI, branch, head)
    with pytest.raises(ValueError):
        sessions.save("ok", Thread("Bad Channel", "x"), "main", None)
    assert [s.name for s in sessions.list()] == ["x" * MAX_NAME]


def test_titles_are_flattened_to_one_line(root):
    stored = SavedSessions(root).save("t", CLI, "main", None, "line one\n\n  line two\t")
    assert stored.title == "line one line two"
    long = SavedSessions(root).save("u", CLI, "main", None, "w" * 500)
    assert len(long.title) == 200 and long.title.endswith("…")


def test_owners_never_see_each_others_sessions(root):
    sessions = SavedSessions(root, owners={"telegram:1001": "alice"})
    mine = sessions.save("work", CLI, "main", "id-1", "my work")
    alices = sessions.save("work", ALICE, "main", "id-2", "alice's work")
    groups = sessions.save("party", GROUP, "main", "id-3")
    assert alices.owner == "alice" and groups.owner == "telegram:-100777"
    assert sessions.get("work", owner="local") == mine
    assert sessions.get("work", owner="alice") == alices
    assert sessions.get("party", owner="local") is None
    assert sessions.list(owner="local") == [mine]
    assert sessions.list(owner="telegram:-100777") == [groups]
    assert sessions.search("work", owner="telegram:-100777") == []
    assert {s.owner for s in sessions.list()} == {"local", "alice", "telegram:-100777"}
    assert sessions.save("shared", ALICE, "main", None, owner="local").owner == "local"


def test_search_by_name_title_and_the_saved_threads_messages(root):
    with Archive(root) as archive:
        archive.append([NewMessage(role="user", text="we fixed the flux capacitor", thread=EMACS)])
        archive.append([NewMessage(role="user", text="flux capacitor in a group", thread=GROUP)])
        sessions = SavedSessions(root, archive=archive)
        parser = sessions.save("parser", CLI, "main", None, "Reader errors")
        garage = sessions.save("garage", EMACS, "main", None, "weekend")
        sessions.save("party", GROUP, "main", None)
        assert sessions.search("PARS") == [parser]
        assert sessions.search("reader") == [parser]
        assert sessions.search("capacitor", owner="local") == [garage]
        assert {s.name for s in sessions.search("capacitor")} == {"garage", "party"}
        assert [s.name for s in sessions.search("", owner="local")] == ["garage", "parser"]
        assert SavedSessions(root).search("capacitor") == []       # no archive: names only


def test_the_file_is_readable_org(root):
    sessions = SavedSessions(root)
    odd = "a [2020-13-01 10:00] <2021-99-01> 50% :tag:"
    sessions.save(odd, CLI, "main", "id-1", ":END: [2020-02-30 Sun]")
    nodes = list(orgparse.load(root / "sessions.org"))[1:]
    assert len(nodes) == 1 and nodes[0].properties["BRANCH"] == "main"
    assert SavedSessions(root).get(odd).title == ":END: [2020-02-30 Sun]"


def test_a_torn_save_is_ignored_and_the_next_save_still_reads(root):
    sessions = SavedSessions(root)
    sessions.save("one", CLI, "main", "id-1")
    path = root / "sessions.org"
    with path.open("a") as stream:
        stream.write("* torn [2026-01-01]\n:PROPERTIES:\n:NAME:     torn\n:OWNER:  lo")
    assert [s.name for s in SavedSessions(root).list()] == ["one"]
    sessions.save("two", CLI, "main", "id-2")
    assert sorted(s.name for s in SavedSessions(root).list()) == ["one", "two"]


names = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp")),
                min_size=1, max_size=MAX_NAME).filter(lambda n: n.strip() == n and n)
titles = st.text(max_size=300)


@settings(max_examples=60, deadline=None)
@given(saves=st.lists(st.tuples(names, titles, st.sampled_from([CLI, EMACS, ALICE, GROUP]),
                                st.sampled_from(["main", "b2", "b10"])), max_size=6))
def test_any_valid_save_round_trips_and_the_latest_wins(saves):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writer = SavedSessions(root)
        expected: dict[tuple[str, str], SavedSession] = {}
        for name, title, thread, branch in saves:
            stored = writer.save(name, thread, branch, "some-id", title)
            assert stored.title == " ".join(title.split())[:200] or stored.title.endswith("…")
            expected[(stored.owner, name.casefold())] = stored
        reader = SavedSessions(root)
        assert sorted(reader.list(), key=lambda s: s.saved_at) == sorted(
            expected.values(), key=lambda s: s.saved_at)
        for (owner, _), stored in expected.items():
            assert reader.get(stored.name, owner=owner) == stored
