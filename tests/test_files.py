"""`files.replace_file`: a file replaced whole, as the inbox, saved sessions, retention, the
skill cache and serve's connection file do."""

from __future__ import annotations

import os
import stat

import pytest

from opencortex import files


def test_a_file_is_replaced_whole_private_and_durably(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(files, "sync_directory", synced.append)
    target = tmp_path / "inbox.jsonl"
    target.write_text("old\n")
    os.chmod(target, 0o644)
    stale = tmp_path / "inbox.jsonl.new"
    stale.write_text("left by a crash")
    files.replace_file(target, b"new\n", temporary=stale)
    assert target.read_bytes() == b"new\n" and not stale.exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert synced == [tmp_path]                     # the rename survives a crash too
    files.replace_file(target, b"cache\n", durable=False)
    assert target.read_bytes() == b"cache\n" and synced == [tmp_path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inbox.jsonl"]


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_failed_replacement_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch,
                                                                       step):
    target = tmp_path / "sessions.org"
    target.write_bytes(b"old")

    def crash(*args, **kwargs):
        raise OSError("simulated failure")
    if step == "write":
        monkeypatch.setattr(files, "write_all", crash)
    else:
        monkeypatch.setattr(files.os, step, crash)
    with pytest.raises(OSError, match="simulated"):
        files.replace_file(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["sessions.org"]
