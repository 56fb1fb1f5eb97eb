"""`opencortex memory import` of Telegram Desktop exports: odd bytes, what messages
hold besides text, and messages the Telegram bridge archived already."""

from __future__ import annotations

import json

import pytest

from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory import telegram_export
from opencortex.memory.importer import import_file
from opencortex.actuation import PLATFORM_ID

GROUP = Thread("telegram", "-1001234")


def export(*messages: dict, chat_type: str = "private_supergroup", chat_id: int = 1234) -> dict:
    return {"name": "Friends", "type": chat_type, "id": chat_id, "messages": list(messages)}


def tg(number: int, text: object = "hi", **more: object) -> dict:
    return {"id": number, "type": "message", "date": "2023-11-14T22:13:20",
            "date_unixtime": str(1_700_000_000 + 60 * number), "from": "Bob",
            "from_id": "user2", "text": text, "text_entities": [], **more}


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


# -- bytes -------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1 << 20, 100, 1])
def test_a_byte_that_is_not_utf8_keeps_every_message_before_it(archive, tmp_path,
                                                                monkeypatch, chunk):
    """One latin-1 byte after 5000 messages lost all of them, and the error said
    "near character 0": a chunk was decoded whole and refused before it was read."""
    monkeypatch.setattr(telegram_export, "CHUNK", chunk)
    count = 5000 if chunk > 1 else 300
    good = json.dumps(export(*[tg(n, f"message {n} é") for n in range(1, count + 1)],
                             tg(count + 1, "café")), indent=1, ensure_ascii=False)
    data = good.encode("utf-8")
    bad_at = data.rindex("café".encode("utf-8")) + 3
    source = tmp_path / "result.json"
    source.write_bytes(data[:bad_at] + b"\xe9" + data[bad_at + 2:])      # latin-1 é
    report = import_file(archive, source)
    assert report.added == count and report.problems == 0
    assert f"is not UTF-8 at byte {bad_at};" in report.stopped
    assert "the messages before it were imported" in report.stopped


def test_an_export_cut_in_a_character_reports_its_byte(archive, tmp_path):
    data = json.dumps(export(tg(1, "one"), tg(2, "zwei ü")), ensure_ascii=False).encode()
    cut = data.index("ü".encode()) + 1
    source = tmp_path / "result.json"
    source.write_bytes(data[:cut])
    report = import_file(archive, source)
    assert report.added == 1 and f"not UTF-8 at byte {cut - 1}" in report.stopped


def test_a_byte_order_mark_is_passed_over(archive, tmp_path):
    """An export starting with a UTF-8 byte order mark was refused: "not valid JSON
    (expected {) near character 0"."""
    source = tmp_path / "result.json"
    text = json.dumps(export(tg(1, "one"), tg(2, "two")), indent=1)
    source.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    report = import_file(archive, source)
    assert (report.format, report.added, report.stopped) == ("telegram", 2, None)
    source.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "").encode("utf-8"))
    assert import_file(archive, source, fmt="telegram").duplicates == 2


# -- what a message holds besides text ----------------------------------------------

def test_polls_contacts_places_and_dice_are_kept_as_notes(archive, tmp_path):
    """They were left out as empty messages ("left out 5 service or empty messages")."""
    poll = {"question": "Lunch?", "closed": False, "total_voters": 3, "answers": [
        {"text": "Yes", "voters": 2, "chosen": True}, {"text": "No", "voters": 1,
                                                       "chosen": False}]}
    messages = [
        tg(1, "", poll=poll),
        tg(2, "", contact_information={"first_name": "Ann", "last_name": "",
                                       "phone_number": "+49 151 2345678"}),
        tg(3, "", location_information={"latitude": 52.52, "longitude": 13.40}),
        tg(4, "", place_name="Café Zeit", address="Hauptstr. 1",
           location_information={"latitude": 52.5, "longitude": 13.4}),
        tg(5, "", dice={"emoji": "🎲", "value": 4}),
        tg(6, "", location_information={"latitude": 1.0, "longitude": 2.0},
           live_location_period_seconds=900),
        tg(7, "see you", poll={"question": [{"type": "bold", "text": "Where"}, "?"],
                               "answers": [{"text": "Here"}]}),
        tg(8, "", todo_list={"title": "Trip", "answers": [{"text": "tickets", "id": 1}]}),
        tg(9, "", contact_information={"first_name": "", "last_name": "",
                                       "phone_number": "+1 555 0100"}),
        tg(10, "", game_title="Lumberjack")]
    source = tmp_path / "result.json"
    source.write_text(json.dumps(export(*messages), ensure_ascii=False), encoding="utf-8")
    report = import_file(archive, source)
    assert (report.added, report.ignored) == (10, 0)
    assert [r.text for r in archive.read_thread(GROUP)] == [
        "[poll: Lunch? — Yes, No]", "[contact: Ann]", "[location]",
        "[location: Café Zeit, Hauptstr. 1]", "[dice 🎲 4]", "[live location]",
        "[poll: Where? — Here] see you", "[to-do list: Trip — tickets]", "[contact]",
        "[game: Lumberjack]"]
    org = archive.thread_file(GROUP).read_text(encoding="utf-8")
    assert "151" not in org and "555" not in org and "52.52" not in org  # never kept


# -- messages the bridge archived ---------------------------------------------------------

def bridged(archive: Archive, thread: Thread, platform_id: str, text: str) -> None:
    """Archive a person's message as the Telegram bridge does."""
    archive.append([NewMessage(role="user", text=text, thread=thread, sender="2",
                               extra={PLATFORM_ID: platform_id, "SENDER_NAME": "Bob"})])


def test_messages_the_bridge_archived_are_not_imported_again(archive, tmp_path):
    """The bridge keeps each message's Telegram id as PLATFORM_ID; the import knew
    only its own ids and so doubled every message the bridge had archived."""
    bridged(archive, GROUP, "7", "seven")
    bridged(archive, GROUP, "8", "eight")
    source = tmp_path / "result.json"
    source.write_text(json.dumps(export(tg(6, "six"), tg(7, "seven"), tg(8, "eight"),
                                        tg(9, "nine"))))
    report = import_file(archive, source)
    assert (report.added, report.duplicates) == (2, 2)
    records = archive.read_thread(GROUP)
    assert sorted(r.text for r in records) == ["eight", "nine", "seven", "six"]
    assert {r.extra[PLATFORM_ID] for r in records} == {"6", "7", "8", "9"}
    assert archive.platform_ids(GROUP) == {"6", "7", "8", "9"}
    again = import_file(archive, source)
    assert (again.added, again.duplicates) == (0, 4)


def test_in_a_private_chat_the_exports_ids_are_not_the_bots(archive, tmp_path):
    """In private chats and basic groups each account numbers messages its own way: an
    export's id 7 is not the bridge's 7, and is not kept as a PLATFORM_ID either (the
    bridge would take a new message 7 for one it answered)."""
    for chat_type, chat_id, thread in [("personal_chat", 55, Thread("telegram", "55")),
                                       ("private_group", 56, Thread("telegram", "-56"))]:
        bridged(archive, thread, "7", "what the bot saw as 7")
        source = tmp_path / f"{chat_type}.json"
        source.write_text(json.dumps(export(tg(7, "what I saw as 7"), chat_type=chat_type,
                                            chat_id=chat_id)))
        report = import_file(archive, source)
        assert (report.added, report.duplicates) == (1, 0)
        imported = archive.read_thread(thread)[-1]
        assert imported.text == "what I saw as 7" and PLATFORM_ID not in imported.extra


# -- messages that cannot be read --------------------------------------------------------

def test_bad_messages_are_skipped_and_reported_and_the_rest_imported(home, tmp_path):
    """A bad value in one message (a date that is no date, a text of another type, a
    message that is no object, an id that is no number) must not stop the import: the
    message is skipped and reported by its position, the good ones after it imported,
    and importing the file again adds nothing."""
    import subprocess
    import sys

    from conftest import cli_env
    bad = [tg(3, "x", date_unixtime="soon"),
           {key: value for key, value in tg(4, "x", date="last week").items()
            if key != "date_unixtime"},
           tg(5, {"not": "text"}), tg(6, [7]), ["not", "an", "object"], {**tg(8, "x"), "id": "8"},
           tg(9, "x", date_unixtime=None)]
    good = [tg(n, f"good {n}") for n in (1, 2, 10, 11)]
    source = tmp_path / "result.json"
    source.write_text(json.dumps(export(*good[:2], *bad, *good[2:]), indent=1))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "opencortex", "memory", "import",
                               str(source), *args], capture_output=True, text=True,
                              timeout=120, env=cli_env(home))

    first = run()
    assert first.returncode == 1 and "Traceback" not in first.stderr
    assert f"imported 4 messages from {source} (telegram)" in first.stdout
    for expected in ["skipped message 3 (id 3): timestamp is not ISO 8601",
                     "skipped message 4 (id 4): timestamp is not ISO 8601",
                     "skipped message 5 (id 5): text must be text",
                     "skipped message 6 (id 6): a text piece is neither",
                     "skipped message 7: not a JSON object",
                     "skipped message 8: id must be a whole number",
                     "skipped message 9 (id 9): timestamp must be",
                     "skipped 7 unreadable lines or messages"]:
        assert expected in first.stderr
    assert "import stopped" not in first.stderr and "soon" not in first.stderr
    with Archive(home / "memory") as archive:
        assert [r.text for r in archive.read_thread(GROUP)] == [
            "good 1", "good 2", "good 10", "good 11"]
    again = json.loads(run("--json").stdout)
    assert (again["added"], again["duplicates"], again["skipped"], again["stopped"]) == (
        0, 4, 7, None)
    assert len(again["problems"]) == 7
