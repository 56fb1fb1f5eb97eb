"""`opencortex memory import` (issue 13): earlier history in, with its own times, once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import cli_env
from opencortex.events import Thread
from opencortex.homelock import HomeLock
from opencortex.memory import Archive, NewMessage
from opencortex.memory import importer, telegram_export
from opencortex.memory.import_source import detect_format
from opencortex.memory.importer import ImportFailed, import_file

T = Thread("telegram", "42")
NOTES = Thread("cli", "notes")
EPOCH_2021 = datetime(2021, 3, 4, 5, 6, 7, tzinfo=timezone.utc).timestamp()


def line(thread: str | None = "telegram:42", role: str = "user", sender: str | None = "alice",
         timestamp: object = EPOCH_2021, text: str = "hello", **more: object) -> str:
    data = {"thread": thread, "role": role, "sender": sender, "timestamp": timestamp,
            "text": text, **more}
    return json.dumps({k: v for k, v in data.items() if v is not None or k == "sender"})


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{text}\n" for text in lines), encoding="utf-8")
    return path


def export(*messages: dict, chat_type: str = "private_supergroup", chat_id: int = 1234) -> dict:
    return {"name": "Friends", "type": chat_type, "id": chat_id, "messages": list(messages)}


def tg(number: int, text: object = "hi", sender: str = "Bob", from_id: str = "user2",
       **more: object) -> dict:
    return {"id": number, "type": "message", "date": "2023-11-14T22:13:20",
            "date_unixtime": str(1_700_000_000 + 60 * number), "from": sender,
            "from_id": from_id, "text": text, "text_entities": [], **more}


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


# -- JSON Lines ------------------------------------------------------------------

def test_jsonl_keeps_original_times_in_org_and_in_search(archive, tmp_path):
    source = write(tmp_path / "h.jsonl",
                   line(text="the walrus sings at dawn", timestamp="2021-03-04T05:06:07Z"),
                   line(role="assistant", sender=None, text="* not a heading\nsecond line",
                        timestamp=EPOCH_2021 + 60),
                   line(thread="notes", role="system", sender="me", text="a note",
                        timestamp="1614834367.5"))
    report = import_file(archive, source)
    assert (report.format, report.added, report.problems) == ("jsonl", 3, 0)
    assert report.threads == {"telegram:42": 2, "cli:notes": 1}
    records = archive.read_thread(T)                 # parsed back from the org file
    assert [(r.role, r.sender, r.timestamp, r.text) for r in records] == [
        ("user", "alice", EPOCH_2021, "the walrus sings at dawn"),
        ("assistant", None, EPOCH_2021 + 60, "* not a heading\nsecond line")]
    assert records[1].parent == records[0].id and records[0].extra == {"IMPORTED": "jsonl"}
    org = archive.thread_file(T).read_text()
    assert f":EPOCH:    {EPOCH_2021!r}" in org and ":PART:     2/2" in org
    hit, = archive.search("walrus")
    assert hit.timestamp == EPOCH_2021 and hit.id == records[0].id
    assert archive.read_thread(NOTES)[0].timestamp == 1614834367.5


def test_timestamps_with_a_zone_and_without_one(archive, tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "JST-9")                # Tokyo: UTC+9, no tzdata needed
    time.tzset()
    try:
        source = write(tmp_path / "h.jsonl", line(timestamp="2021-03-04T14:06:07", text="local"),
                       line(timestamp="2021-03-04T06:06:07+01:00", text="offset"),
                       line(timestamp=1614834367, text="epoch"))
        import_file(archive, source)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [r.timestamp for r in archive.read_thread(T)] == [EPOCH_2021] * 3


def test_reimporting_adds_nothing_and_a_longer_file_adds_only_the_new_lines(archive, tmp_path):
    lines = [line(text=f"message {n}", timestamp=EPOCH_2021 + n) for n in range(5)]
    source = write(tmp_path / "h.jsonl", *lines[:3], lines[0])     # a line twice
    first = import_file(archive, source)
    assert (first.added, first.duplicates) == (3, 1)
    size = archive.thread_file(T).stat().st_size
    again = import_file(archive, source)
    assert (again.added, again.duplicates) == (0, 4)
    assert archive.thread_file(T).stat().st_size == size
    longer = import_file(archive, write(tmp_path / "more.jsonl", *lines))
    assert (longer.added, longer.duplicates) == (2, 3)
    assert [r.text for r in archive.read_thread(T)] == [f"message {n}" for n in range(5)]
    assert archive.reindex() == 5                    # the index agrees with the org files


def test_bad_lines_are_reported_by_number_and_skipped(archive, tmp_path, monkeypatch):
    monkeypatch.setattr(importer, "MAX_LINE_BYTES", 200)
    source = tmp_path / "h.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + "\n".join([
        line(text="first"), "", "not json", "[1, 2]", line(thread="bogus:1"),
        line(role="robot"), line(timestamp=1e300), line(timestamp="yesterday"),
        line(text="   "), line(sender=["x"]), line(text="bad \ud800"),
        line(text="x" * 300), "[" * 100_000, line(thread=None), line(text="last")]).encode()
        + b"\n\xff\xfe\n")
    report = import_file(archive, source)
    assert report.added == 2 and [r.text for r in archive.read_thread(T)] == ["first", "last"]
    shown = {p.where: p.reason for p in report.shown}
    assert sorted(int(where.split()[1]) for where in shown) == [3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                12, 13, 14, 16]
    assert "JSON" in shown["line 3"] and "object" in shown["line 4"]
    assert "unknown channel" in shown["line 5"] and "role must be" in shown["line 6"]
    assert "year 3000" in shown["line 7"] and "ISO 8601" in shown["line 8"]
    assert "non-empty" in shown["line 9"] and "sender" in shown["line 10"]
    assert "surrogate" in shown["line 11"] and "longer than 200 bytes" in shown["line 12"]
    assert "thread is missing" in shown["line 14"]
    assert "bad \ud800" not in " ".join(shown.values())   # content is never repeated


def test_lines_without_a_thread_go_to_the_thread_given(archive, tmp_path):
    source = write(tmp_path / "h.jsonl", line(thread=None, text="a"), line(text="b"))
    report = import_file(archive, source, thread=NOTES)
    assert report.threads == {"cli:notes": 1, "telegram:42": 1}


def test_messages_wait_per_thread_and_are_written_in_bounded_batches(archive, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(importer, "BATCH", 3)
    monkeypatch.setattr(importer, "MAX_PENDING", 5)
    threads = ["telegram:1", "telegram:2", "cli:a"]
    lines = [line(thread=threads[n % 3], text=f"m{n}", timestamp=EPOCH_2021 + n)
             for n in range(40)]
    batches: list[int] = []
    append = archive.append
    monkeypatch.setattr(archive, "append", lambda messages, **kw: (
        batches.append(len(messages)), append(messages, **kw))[1])
    report = import_file(archive, write(tmp_path / "h.jsonl", *lines))
    assert report.added == 40 and sum(batches) == 40 and max(batches) <= 3
    writes = 0
    for n, name in enumerate(threads):
        records = archive.read_thread(Thread.parse(name))
        assert [r.text for r in records] == [f"m{i}" for i in range(n, 40, 3)]
        writes += archive.thread_file(Thread.parse(name)).read_text().count(":PART:     1/")
    assert writes == len(batches) > 3                # each batch is one whole write


def test_importing_older_messages_into_a_live_thread_is_counted(archive, tmp_path):
    archive.append([NewMessage(role="user", text="today", thread=T)])
    report = import_file(archive, write(tmp_path / "h.jsonl", line(text="long ago")))
    assert (report.added, report.older) == (1, 1)


# -- Telegram Desktop exports ------------------------------------------------------

def test_telegram_export_with_entities_senders_and_an_assistant(archive, tmp_path):
    data = export(
        {"id": 1, "type": "service", "date": "2023-11-14T22:00:00", "actor": "Bob",
         "action": "create_group", "text": ""},
        tg(2, ["see ", {"type": "bold", "text": "the zebra"}, " at ",
               {"type": "text_link", "text": "this page", "href": "https://example.org/z"}]),
        tg(3, "zebras are striped", sender="Helper Bot", from_id="user99"),
        tg(4, "", photo="(File not included.)"),
        tg(5, [{"type": "plain", "text": "caption"}], media_type="sticker", sticker_emoji="🦓",
           reply_to_message_id=3),
        tg(6, ""))
    source = tmp_path / "result.json"
    source.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    assert detect_format(source) == "telegram"
    report = import_file(archive, source, assistants=["Helper Bot"])
    thread = Thread("telegram", "-1001234")
    assert (report.added, report.ignored, report.threads) == (4, 2, {str(thread): 4})
    records = archive.read_thread(thread)
    assert [(r.role, r.sender, r.text) for r in records] == [
        ("user", "2", "see the zebra at this page (https://example.org/z)"),
        ("assistant", "99", "zebras are striped"),
        ("user", "2", "[photo]"),
        ("user", "2", "[sticker 🦓] caption")]
    assert records[0].timestamp == 1_700_000_120.0
    assert records[0].extra == {"IMPORTED": "telegram", "SOURCE_ID": "2", "SENDER_NAME": "Bob",
                                "PLATFORM_ID": "2"}    # a supergroup: the bot's ids too
    assert records[3].extra["REPLY_TO"] == "3"
    assert archive.search("zebra", thread=thread)
    assert archive.speakers("what did bob and the helper say", threads=[thread]) == [
        "bob", "helper"]                   # display names name their senders for recall
    again = import_file(archive, source, assistants=["99"])
    assert (again.added, again.duplicates) == (0, 4)


def test_an_odd_display_name_is_cleaned_as_the_bridges_clean_it_never_refused(
        archive, tmp_path):
    """A display name is anyone's choice: one of several lines, with escape sequences
    or thousands of characters is kept cleaned and cut (as a bridge keeps it), and its
    message imported (it used to be skipped: a name over 512 characters lost it)."""
    odd = "Eve\n\x1b]0;X\x07 " + "A" * 5000
    source = tmp_path / "result.json"
    source.write_text(json.dumps(export(tg(1, "kept", sender=odd), tg(2, "also", sender=""),
                                        tg(3, "no name", sender=None))))
    report = import_file(archive, source)
    assert (report.added, report.problems) == (3, 0)
    first, second, third = archive.read_thread(Thread("telegram", "-1001234"))
    assert first.extra["SENDER_NAME"] == ("Eve ]0;X " + "A" * 5000)[:256]
    assert "SENDER_NAME" not in second.extra and "SENDER_NAME" not in third.extra
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(export(tg(1, "x", sender=["not", "text"]))))
    assert "from must be text or null" in str(import_file(archive, bad).shown[0])


def test_the_thread_follows_the_chat_type_or_the_option(archive, tmp_path):
    for chat_type, chat_id, expected in [("personal_chat", 55, "55"), ("private_group", 56, "-56"),
                                         ("public_channel", 57, "-10057")]:
        source = tmp_path / f"{chat_type}.json"
        source.write_text(json.dumps(export(tg(1), chat_type=chat_type, chat_id=chat_id)))
        assert import_file(archive, source).threads == {f"telegram:{expected}": 1}
    report = import_file(archive, source, thread=Thread("telegram", "7"))
    assert report.threads == {"telegram:7": 1}


def test_telegram_export_read_in_tiny_chunks_gives_the_same_messages(tmp_path, monkeypatch):
    data = export(*[tg(n, [f"piece {n} ", {"type": "italic", "text": "é\\\"ü" * n}])
                    for n in range(1, 30)])
    source = tmp_path / "result.json"
    source.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    results = []
    for chunk in (1 << 20, 7, 1):
        monkeypatch.setattr(telegram_export, "CHUNK", chunk)
        with Archive(tmp_path / f"memory-{chunk}") as archive:
            assert import_file(archive, source).added == 29
            results.append([(r.id, r.text) for r in archive.read_thread(
                Thread("telegram", "-1001234"))])
    assert results[0] == results[1] == results[2]


def test_a_broken_export_stops_with_a_clear_error_after_saving_what_came_before(
        archive, tmp_path, monkeypatch):
    monkeypatch.setattr(telegram_export, "CHUNK", 64)
    good = json.dumps(export(tg(1, "one"), tg(2, "two"), tg(3, "three")), indent=1)
    source = tmp_path / "result.json"
    source.write_text(good.replace('"id": 3', '"id": 3 oops'))
    report = import_file(archive, source)
    assert report.added == 2 and "not valid JSON" in report.stopped
    assert "the messages before it were imported" in report.stopped
    source.write_text(good[:good.index('"id": 3') + 5])          # cut short
    report = import_file(archive, source)
    assert report.duplicates == 2 and "ends too early" in report.stopped
    monkeypatch.setattr(telegram_export, "MAX_VALUE_CHARS", 1000)
    source.write_text(json.dumps(export(tg(1, "one"), tg(4, "x" * 5000))))
    assert "longer than 1000 characters" in import_file(archive, source).stopped
    source.write_bytes(json.dumps(export(tg(5, "é")), ensure_ascii=False).encode("utf-8")
                       .replace(b"\xc3", b"\xff"))
    assert "is not UTF-8" in import_file(archive, source).stopped


def test_exports_that_cannot_be_imported_say_what_to_do(archive, tmp_path):
    source = tmp_path / "result.json"
    for data, expected in [({"about": "x", "chats": {"list": []}}, "whole-account"),
                           ({"name": "x", "messages": [tg(1)]}, "pass --thread"),
                           ({"name": "x", "type": "personal_chat"}, "no `messages` list")]:
        source.write_text(json.dumps(data))
        report = import_file(archive, source, fmt="telegram")
        assert report.added == 0 and expected in report.stopped
    source.write_text("plain text, not JSON\n")
    with pytest.raises(ImportFailed, match="--format"):
        import_file(archive, source)
    with pytest.raises(ImportFailed, match="--assistant"):
        import_file(archive, write(tmp_path / "h.jsonl", line()), assistants=["Bob"])


def test_a_one_line_export_is_told_from_json_lines(tmp_path):
    source = tmp_path / "result.json"
    source.write_text(json.dumps(export(tg(1))))
    assert detect_format(source) == "telegram"
    assert detect_format(write(tmp_path / "h.jsonl", line())) == "jsonl"


def test_append_with_given_ids_refuses_known_or_malformed_ones(archive):
    message = NewMessage(role="user", text="x", thread=T)
    archive.append([message], ids=["abc-1"])
    for ids in (["abc-1"], ["has space"], ["a", "b"], ["%5B"]):
        with pytest.raises(ValueError):
            archive.append([message], ids=ids)
    assert [r.id for r in archive.read_thread(T)] == ["abc-1"]
    assert archive.known_ids(["abc-1", "other"]) == {"abc-1"}


# -- the command -----------------------------------------------------------------------

def oc(home: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "opencortex", *args],
                          capture_output=True, text=True, timeout=120, env=cli_env(home))


def test_cli_imports_then_says_nothing_is_new(home, tmp_path):
    source = write(tmp_path / "h.jsonl", line(text="the okapi"), "oops", line(text="again"))
    run = oc(home, "memory", "import", str(source))
    assert run.returncode == 1, run.stderr
    assert f"imported 2 messages from {source} (jsonl) into telegram:42 (2)" in run.stdout
    assert "skipped line 2: not valid JSON" in run.stderr and "Traceback" not in run.stderr
    run = oc(home, "memory", "import", str(source), "--json")
    data = json.loads(run.stdout)
    assert run.returncode == 1 and data["status"] == "incomplete"
    assert (data["added"], data["duplicates"], data["problems"]) == (
        0, 2, ["line 2: not valid JSON (or not UTF-8)"])
    fixed = write(tmp_path / "fixed.jsonl", line(text="the okapi"), line(text="again"))
    run = oc(home, "memory", "import", str(fixed))
    assert run.returncode == 0 and "nothing new: the 2 messages" in run.stdout
    hits = json.loads(oc(home, "memory", "search", "okapi", "--json").stdout)["hits"]
    assert [h["timestamp"] for h in hits] == [EPOCH_2021]


def test_cli_leaves_each_imported_thread_a_checkpoint_to_resume_from(home, tmp_path):
    from opencortex.config import load_config
    from opencortex.conversation.checkpoint import CHECKPOINT
    from opencortex.conversation.threadlog import ThreadLog
    lines = [line(thread=f"telegram:{chat}", role=role, text=f"{chat} {n} {role}")
             for chat in (42, 43) for n in range(250) for role in ("user", "assistant")]
    source = write(tmp_path / "h.jsonl", *lines)
    assert oc(home, "memory", "import", str(source)).returncode == 0
    assert oc(home, "memory", "import", str(source)).returncode == 0      # nothing new
    with Archive(load_config(home).memory_dir) as archive:
        for chat in (42, 43):
            thread = Thread("telegram", str(chat))
            records = archive.thread_records(thread)
            checkpoints = [r for r in records if CHECKPOINT in r.extra]
            assert len(checkpoints) == 1 and checkpoints[0] is records[-1]
            resumed = ThreadLog.resume(archive, thread, window=10)
            assert resumed._partial and resumed.turn_count() == 250
            assert [e.text for e in resumed.entries(limit=1)] == [f"{chat} 249 assistant"]
    short = write(tmp_path / "short.jsonl", line(thread="telegram:44", text="a"),
                  line(thread="telegram:44", text="b"))
    assert oc(home, "memory", "import", str(short)).returncode == 0
    with Archive(load_config(home).memory_dir) as archive:      # read whole at no cost
        assert [r.role for r in archive.read_thread(Thread("telegram", "44"))] == ["user"] * 2


def test_cli_telegram_options_and_a_missing_file(home, tmp_path):
    source = tmp_path / "result.json"
    source.write_text(json.dumps(export(tg(1, "hello"), tg(2, "hi", sender="Bot",
                                                            from_id="user9"))))
    run = oc(home, "memory", "import", str(source), "--format", "telegram", "--thread",
             "telegram:77", "--assistant", "user9", "--json")
    data = json.loads(run.stdout)
    assert run.returncode == 0 and data["status"] == "ok" and data["threads"] == {
        "telegram:77": 2}
    with Archive(home / "memory") as archive:
        assert [r.role for r in archive.read_thread(Thread("telegram", "77"))] == [
            "user", "assistant"]
    run = oc(home, "memory", "import", str(tmp_path / "missing.jsonl"))
    assert run.returncode == 1 and "No such file" in run.stderr and "Traceback" not in run.stderr
    run = oc(home, "memory", "import", str(source), "--thread", "nowhere:1")
    assert run.returncode == 1 and "unknown channel" in run.stderr


def test_cli_refuses_while_a_kernel_serves_the_home(home, tmp_path):
    source = write(tmp_path / "h.jsonl", line())
    lock = HomeLock(home)
    try:
        run = oc(home, "memory", "import", str(source))
    finally:
        lock.release()
    assert run.returncode == 1 and "already running" in run.stderr
    assert not (home / "memory" / "telegram").exists()


def test_cli_refuses_a_home_it_cannot_write(home, tmp_path):
    source = write(tmp_path / "h.jsonl", line())
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a home read-only")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    (home / "memory").mkdir()
    paths = [home, home / "memory"]
    for path in paths:
        path.chmod(0o555)
    try:
        run = oc(home, "memory", "import", str(source), prefix=prefix)
    finally:
        for path in paths:
            path.chmod(0o700)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"cannot write to {home}" in run.stderr and "importing needs a writable home" in run.stderr
