"""`opencortex memory import`: the file read once (pipes), its format told, many owners."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import cli_env
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory.import_source import detect_format
from opencortex.memory.importer import ImportFailed, import_file

EPOCH = 1_600_000_000


def line(thread: str = "telegram:50", text: str = "x", n: int = 0, **first: object) -> str:
    """One JSON line; the keys FIRST come before the usual ones."""
    return json.dumps({**first, "thread": thread, "role": "user", "sender": "a",
                       "timestamp": EPOCH + n, "text": text})


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{text}\n" for text in lines), encoding="utf-8")
    return path


def oc(home: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opencortex", *args], input=stdin,
                          capture_output=True, timeout=120, env=cli_env(home))


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


class Pipe:
    """A pipe fed DATA by a thread; PATH (/dev/fd/N) opens its reading end."""

    def __init__(self, data: bytes):
        self.read_end, write_end = os.pipe()
        self.path = Path(f"/dev/fd/{self.read_end}")
        self.writer = threading.Thread(target=self._feed, args=(write_end, data), daemon=True)
        self.writer.start()

    @staticmethod
    def _feed(fd: int, data: bytes) -> None:
        try:
            with open(fd, "wb") as stream:
                stream.write(data)
        except BrokenPipeError:       # the reader stopped early (the import was refused)
            pass

    def close(self) -> None:
        os.close(self.read_end)
        self.writer.join(timeout=30)


# -- a pipe is read once ----------------------------------------------------------

def test_a_pipe_with_automatic_format_loses_nothing(home, tmp_path):
    """`cat s.jsonl | opencortex memory import /dev/stdin` lost the first 64 KB: the
    format was told from one open of the file, the messages read from another."""
    data = "".join(f"{line(text=f'message number {n}', n=n)}\n" for n in range(2000))
    run = oc(home, "memory", "import", "/dev/stdin", "--json", stdin=data.encode())
    report = json.loads(run.stdout)
    assert run.returncode == 0, run.stderr
    assert (report["format"], report["added"], report["skipped"]) == ("jsonl", 2000, 0)
    assert not [p for p in (home / "memory").iterdir() if p.name.startswith(".import-")]


def test_a_telegram_export_from_a_pipe(archive):
    export = {"name": "G", "type": "personal_chat", "id": 9, "messages": [
        {"id": n, "type": "message", "date_unixtime": str(EPOCH + n), "from": "Bob",
         "from_id": "user2", "text": f"hi {n} " + "x" * 100} for n in range(1, 1001)]}
    pipe = Pipe(json.dumps(export, indent=1).encode())
    try:
        report = import_file(archive, pipe.path)
    finally:
        pipe.close()
    assert (report.format, report.added, report.stopped) == ("telegram", 1000, None)


# -- telling the format ---------------------------------------------------------------

@pytest.mark.parametrize("first", [{"type": "chat"}, {"name": "Ann"}, {"about": "me"},
                                   {"messages": []}, {"chats": 1}])
def test_json_lines_with_other_keys_are_json_lines(tmp_path, archive, first):
    """Valid JSON lines whose first key was "type", "name" or "about", or with a
    "messages" key, were taken for a Telegram export (and nothing was imported)."""
    source = write(tmp_path / "h.jsonl", [line(n=n, **first) for n in range(3)])
    assert detect_format(source) == "jsonl"
    report = import_file(archive, source)
    assert (report.format, report.added, report.stopped) == ("jsonl", 3, None)
    alone = write(tmp_path / "one.jsonl", [line(**first)])        # one line alone
    assert detect_format(alone) == "jsonl"


def test_an_export_on_one_line_or_many_is_telegram_and_neither_says_pass_format(tmp_path):
    export = {"name": "G", "type": "personal_chat", "id": 9, "messages": []}
    one = write(tmp_path / "one.json", [json.dumps(export)])
    many = write(tmp_path / "many.json", [json.dumps(export, indent=1)])
    account = write(tmp_path / "account.json", [json.dumps({"about": "x", "chats": {}})])
    assert [detect_format(p) for p in (one, many, account)] == ["telegram"] * 3
    broken = write(tmp_path / "broken.jsonl", ["{oops", line(), line(n=1)])
    assert detect_format(broken) == "jsonl"                   # line 1 is reported, skipped
    for text in ("plain words\nmore words", "[1, 2]\n[3]", '{"a": 1'):
        source = write(tmp_path / "odd.txt", [text])
        with pytest.raises(ImportFailed, match="pass --format jsonl or --format telegram"):
            detect_format(source)


# -- owners ---------------------------------------------------------------------------------

def test_an_import_of_many_chats_leaves_the_index_few_tables(archive, tmp_path, monkeypatch):
    """Every chat is an owner; each had FTS tables of its own, and thousands of them made
    every start take tens of seconds (an import past 1,000 owners was refused unless
    --many-owners).  Owners past OWN_TABLES now share tables (see `partitions`)."""
    from opencortex.memory import partitions
    monkeypatch.setattr(partitions, "OWN_TABLES", 4)
    monkeypatch.setattr(partitions, "SHARED_TABLES", 2)
    source = write(tmp_path / "h.jsonl", [line(thread=f"telegram:{n % 60}", n=n,
                                               text=f"gecko {n % 60}") for n in range(180)])
    report = import_file(archive, source)
    assert (report.added, report.stopped) == (180, None)
    db = sqlite3.connect(tmp_path / "memory" / "index.sqlite")
    tables = db.execute("SELECT count(*) FROM sqlite_master WHERE sql LIKE "
                        "'CREATE VIRTUAL%'").fetchone()[0]
    db.close()
    assert tables <= 4 + 2
    for n in (0, 30, 59):
        hits = archive.search("gecko", thread=Thread("telegram", str(n)), limit=10)
        assert [h.text for h in hits] == [f"gecko {n}"] * 3


def test_the_import_summary_shows_control_characters_of_a_hostile_file_as_visible(
        tmp_path, capsys):
    """A thread id, path or problem from the file never reaches the terminal as a control:
    an ESC in a chat id would retitle or clear the terminal of whoever imports it."""
    from opencortex.memory_commands import _print_import
    from opencortex.memory.importer import ImportReport, Problem
    report = ImportReport("jsonl", added=1, threads={"emacs:x\x1b]0;pwned\x07": 1},
                          stopped="stop \x1b[2J")
    report.problem(Problem("line 2", "bad \x1b[31m value"))
    _print_import(report, tmp_path / "a\x1bb.jsonl")
    shown = capsys.readouterr()
    assert "\x1b" not in shown.out + shown.err and "\x07" not in shown.out
    assert "emacs:x␛]0;pwned␇ (1)" in shown.out and "bad ␛[31m value" in shown.err


def test_a_text_said_twice_in_a_row_at_the_same_time_is_two_messages(tmp_path):
    """Times in minutes ("ok", "lol", "ok" within one) are three messages, kept on every
    import; the same line again after the thread's time moved on is still one."""
    import json
    from opencortex.events import Thread
    from opencortex.memory import Archive
    from opencortex.memory.importer import import_file
    said = [("ok", 60), ("lol", 60), ("ok", 60), ("ok", 60), ("sure", 120), ("ok", 60)]
    source = tmp_path / "h.jsonl"
    source.write_text("".join(json.dumps({"thread": "cli:x", "role": "user", "sender": "a",
                                          "timestamp": 1.7e9 + at, "text": text}) + "\n"
                              for text, at in said))
    with Archive(tmp_path / "memory") as archive:
        first = import_file(archive, source)
        assert (first.added, first.duplicates) == (5, 1)
        again = import_file(archive, source)
        assert (again.added, again.duplicates) == (0, 6)
        assert [m.text for m in archive.read_thread(Thread("cli", "x"))] == \
            ["ok", "lol", "ok", "ok", "sure"]


def test_a_json_line_nested_too_deeply_says_so_and_the_next_lines_come_in(tmp_path):
    import json
    from opencortex.memory import Archive
    from opencortex.memory.importer import import_file
    good = json.dumps({"thread": "cli:x", "role": "user", "timestamp": 1.7e9, "text": "hi"})
    source = tmp_path / "h.jsonl"
    source.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n" + good + "\n")
    with Archive(tmp_path / "memory") as archive:
        report = import_file(archive, source)
    assert report.added == 1
    assert [str(p) for p in report.shown] == ["line 1: nests too deeply to be read"]
