"""sessions.org stays bounded: per-owner limit, compaction (crash-safe), incremental reads."""

from __future__ import annotations

import os

import orgparse
import pytest

from opencortex import files
from opencortex.conversation import savedfile
from opencortex.conversation.saved import SavedSessions, parse_saves
from opencortex.events import Thread

CLI = Thread("cli", "local")
GUEST = Thread("telegram", "4242")


@pytest.fixture
def root(tmp_path):
    return tmp_path / "memory"


def entries(root) -> list:
    """The complete entries in the file (superseded ones included)."""
    return parse_saves((root / "sessions.org").read_text())


def test_a_flood_of_saves_keeps_the_file_and_the_index_bounded(root):
    sessions = SavedSessions(root, per_owner=20)
    sessions.save("mine", CLI, "main", None)
    most = 0
    for i in range(3000):
        sessions.save(f"guest save {i % 50}", GUEST, "main", "id-1", f"t{i}")
        most = max(most, len(entries(root))) if i % 100 == 0 else most
    live = 21
    limit = live + max(savedfile.COMPACT_MIN, live) + 1
    assert most <= limit and len(entries(root)) <= limit
    assert sessions._index.live() == live
    assert len(sessions.list(owner="telegram:4242")) == 20
    assert [s.name for s in sessions.list(owner="local")] == ["mine"]   # not let go
    fresh = SavedSessions(root, per_owner=20)
    assert [s.name for s in fresh.list(owner="telegram:4242")][:2] == ["guest save 49",
                                                                       "guest save 48"]
    assert fresh.get("guest save 49", owner="telegram:4242").title == "t2999"
    assert list(orgparse.load(root / "sessions.org"))[1].properties["OWNER"] == "local"


def test_a_resave_replaces_and_the_oldest_name_is_let_go_and_reported(root):
    sessions = SavedSessions(root, per_owner=3)
    for name in ("a", "b", "c"):
        assert sessions.save_reporting(name, GUEST, "main", None)[1] is None
    assert sessions.save_reporting("A", GUEST, "b2", None)[1] is None      # same name
    assert sessions.get("a", owner="telegram:4242").branch == "b2"
    stored, let_go = sessions.save_reporting("d", GUEST, "main", None)
    assert let_go == "b" and stored.name == "d"
    assert sorted(s.name for s in SavedSessions(root, per_owner=3).list()) == ["A", "c", "d"]
    assert SavedSessions(root, per_owner=3).get("b") is None


def test_one_owners_flood_never_touches_another_owners_saves(root):
    sessions = SavedSessions(root, per_owner=5)
    mine = sessions.save("work", CLI, "main", "id-1")
    for i in range(600):
        sessions.save(f"n{i}", GUEST, "main", None)
    assert sessions.list(owner="local") == [mine]
    assert all(s.owner == "telegram:4242" for s in sessions.list(owner="telegram:4242"))
    assert SavedSessions(root).get("work", owner="telegram:4242") is None
    assert SavedSessions(root).get("n599", owner="local") is None


def test_reading_after_a_save_parses_only_what_was_appended(root, monkeypatch):
    sessions = SavedSessions(root)
    for i in range(200):
        sessions.save(f"guest {i}", GUEST, "main", None)
    reader = SavedSessions(root)
    assert len(reader.list(owner="local")) == 0               # reads the whole file once
    parsed: list[int] = []
    real = savedfile.parse_saves
    monkeypatch.setattr(savedfile, "parse_saves",
                        lambda text: parsed.append(len(real(text))) or real(text))
    sessions.save("mine", CLI, "main", None)
    assert [s.name for s in reader.list(owner="local")] == ["mine"]
    assert reader.list(owner="local") and parsed == [1, 1]    # writer and reader: the new one


def test_a_file_replaced_or_rewritten_by_hand_is_read_again(root):
    sessions = SavedSessions(root)
    sessions.save("one", CLI, "main", None)
    reader = SavedSessions(root)
    assert [s.name for s in reader.list()] == ["one"]
    path = root / "sessions.org"
    path.write_text(path.read_text().replace("one", "two"))   # same size, in place
    assert [s.name for s in reader.list()] == ["two"]


def flood(sessions: SavedSessions, count: int) -> None:
    for i in range(count):
        sessions.save(f"guest {i % 3}", GUEST, "main", None, f"t{i}")


@pytest.mark.parametrize("step", ["write", "fsync", "replace", "sync_directory"])
def test_a_failure_at_any_step_of_compaction_loses_nothing(root, monkeypatch, step):
    sessions = SavedSessions(root)
    sessions.save("mine", CLI, "main", "id-1")
    flood(sessions, savedfile.COMPACT_MIN + 3)                # one save below the threshold
    assert len(entries(root)) == savedfile.COMPACT_MIN + 4

    def crash(*args, **kwargs):
        raise OSError("simulated crash")
    real_fsync = os.fsync

    def fsync_crashing_on_the_new_file(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".new"):
            raise OSError("simulated crash")
        real_fsync(fd)
    if step == "write":
        monkeypatch.setattr(files, "write_all", crash)
    elif step == "sync_directory":
        monkeypatch.setattr(files, "sync_directory", crash)
    elif step == "fsync":
        monkeypatch.setattr(savedfile.os, "fsync", fsync_crashing_on_the_new_file)
    else:
        monkeypatch.setattr(savedfile.os, "replace", crash)
    sessions.save("guest 0", GUEST, "main", None, "last")     # triggers the compaction
    monkeypatch.undo()
    after = SavedSessions(root)
    assert after.get("mine", owner="local").head == "id-1"
    assert after.get("guest 0", owner="telegram:4242").title == "last"
    assert {s.name for s in after.list()} == {"mine", "guest 0", "guest 1", "guest 2"}
    if step in ("replace", "write", "fsync"):                 # the old file, all of it
        assert len(entries(root)) == savedfile.COMPACT_MIN + 5
    assert not (root / "sessions.org.new").exists() or step == "sync_directory"
    sessions.save("again", CLI, "main", None)                 # the next save compacts
    assert len(entries(root)) == 5
    assert not (root / "sessions.org.new").exists()


def test_a_temporary_file_left_by_a_crash_is_harmless(root):
    sessions = SavedSessions(root)
    sessions.save("mine", CLI, "main", None)
    (root / "sessions.org.new").write_text("* half a compaction\n:PROPERTIES:\n")
    flood(sessions, savedfile.COMPACT_MIN + 4)
    assert len(entries(root)) == 4
    assert {s.name for s in SavedSessions(root).list()} == {"mine", "guest 0", "guest 1",
                                                            "guest 2"}
    assert oct(os.stat(root / "sessions.org").st_mode & 0o777) == "0o600"


def test_a_long_file_is_read_in_pieces(root, monkeypatch):
    sessions = SavedSessions(root)
    for i in range(40):
        sessions.save(f"guest {i % 4}", GUEST, "main", None, "x" * 150)
    monkeypatch.setattr(savedfile, "READ_CHUNK", 100)         # less than one entry
    reader = SavedSessions(root)
    assert sorted(s.name for s in reader.list()) == ["guest 0", "guest 1", "guest 2",
                                                     "guest 3"]
    assert reader._index.entries == 40
