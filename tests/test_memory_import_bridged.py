"""`memory import` of a Telegram export of a chat the Telegram bridge archived already.

In a private chat or basic group the export's message ids are not the bot's,
and the bot's replies carry no Telegram id anywhere: every message the bridge
had archived was imported again, the bot's replies too.  Such a message is
now recognised by side, text and time (see `memory.bridged`), in real org
files through the real index.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencortex.actuation import PLATFORM_ID
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory import bridged
from opencortex.memory.importer import import_file

PRIVATE = Thread("telegram", "55")
GROUP = Thread("telegram", "-1001234")
T0 = 1_700_000_000           # the export's times: whole seconds
PERSON, BOT = ("Bob", "user2"), ("Helper", "user999")


@pytest.fixture
def archive(tmp_path, monkeypatch):
    monkeypatch.setattr("os.fsync", lambda fd: None)      # durability is not under test
    with Archive(tmp_path / "memory") as opened:
        yield opened


def turn(archive: Archive, thread: Thread, message_id: int, said: str, at: float,
         reply: str | None = None, reply_at: float | None = None) -> None:
    """Archive one turn as the Telegram bridge does: the person's message (their id,
    name and the bot's message id) stamped AT, the reply stamped REPLY_AT."""
    messages = [NewMessage(role="user", text=said, thread=thread, sender="2", timestamp=at,
                           extra={PLATFORM_ID: str(message_id), "SENDER_NAME": "Bob"})]
    if reply is not None:
        messages.append(NewMessage(role="assistant", text=reply, thread=thread,
                                   timestamp=reply_at, extra={"TOKENS_IN": "40",
                                                              "TOKENS_OUT": "9"}))
    archive.append(messages)


def tg(number: int, text: object, at: int, who: tuple[str, str] = PERSON,
       **more: object) -> dict:
    return {"id": number, "type": "message", "date": "2023-11-14T22:13:20",
            "date_unixtime": str(at), "from": who[0], "from_id": who[1], "text": text,
            "text_entities": [], **more}


def exported(tmp_path: Path, *messages: dict, chat_type: str = "personal_chat",
             chat_id: int = 55) -> Path:
    source = tmp_path / f"{chat_type}.json"
    source.write_text(json.dumps({"name": "Bob", "type": chat_type, "id": chat_id,
                                  "messages": list(messages)}, ensure_ascii=False))
    return source


def texts(archive: Archive, thread: Thread) -> list[tuple[str, str]]:
    return [(r.role, r.text) for r in archive.read_thread(thread)]


def test_a_private_chat_the_bridge_archived_adds_only_what_came_before_it(
        archive, tmp_path, monkeypatch):
    """The person's messages (a caption too) and the bot's replies (formatted, with a
    link) that the bridge archived are recognised; what came before the bridge is
    imported; nothing is read whole to tell."""
    turn(archive, PRIVATE, 7001, "hello bot", T0 + 100.4, "Hello Bob!", T0 + 102.9)
    turn(archive, PRIVATE, 7002, "look at this", T0 + 140.2,
         "A *fine* photo, see [[https://example.org/cats][the cats]]", T0 + 141.6)
    turn(archive, PRIVATE, 7003, "and this?", T0 + 200 + 45.0, "  Nice.\n", T0 + 247.1)
    before = texts(archive, PRIVATE)
    source = exported(
        tmp_path,
        tg(1, "before the bot", T0), tg(2, "ok", T0 + 5),
        tg(10, "hello bot", T0 + 100), tg(11, "Hello Bob!", T0 + 102, BOT),
        tg(12, "look at this", T0 + 140, photo="photos/1.jpg"),
        tg(13, ["A ", {"type": "bold", "text": "fine"}, " photo, see ",
                {"type": "text_link", "text": "the cats", "href": "https://example.org/cats"}],
           T0 + 141, BOT),
        tg(14, "and this?", T0 + 200), tg(15, "Nice.", T0 + 247, BOT))
    for whole in ("thread_records", "read_thread"):
        monkeypatch.setattr(archive, whole, lambda *args: pytest.fail("read whole"))
    report = import_file(archive, source)
    monkeypatch.undo()
    assert (report.added, report.duplicates) == (2, 6)
    assert texts(archive, PRIVATE) == before + [("user", "before the bot"), ("user", "ok")]
    assert (import_file(archive, source).added, texts(archive, PRIVATE)[-1]) == (
        0, ("user", "ok"))


def test_the_same_text_at_another_time_or_from_another_person_is_kept(archive, tmp_path):
    """Two "ok" the bridge archived seconds apart stand for two exported ones; an "ok"
    it did not archive (minutes later, or someone else's) is imported; each archived
    message stands for one exported message only."""
    turn(archive, PRIVATE, 7001, "ok", T0 + 0.6)
    turn(archive, PRIVATE, 7002, "ok", T0 + 3.2)
    source = exported(tmp_path, tg(1, "ok", T0), tg(2, "ok", T0 + 3), tg(3, "ok", T0 + 4),
                      tg(4, "ok", T0 + 300), tg(5, "ok", T0 + 1, ("Ann", "user3")))
    report = import_file(archive, source)
    assert (report.added, report.duplicates) == (3, 2)
    kept = sorted((r.sender, r.timestamp) for r in archive.read_thread(PRIVATE))
    assert kept == [("2", T0 + 0.6), ("2", T0 + 3.2), ("2", T0 + 4), ("2", T0 + 300),
                    ("3", T0 + 1)]


@pytest.mark.parametrize("late, recognised", [
    (-bridged.EARLY - 0.5, False), (-bridged.EARLY + 0.5, True), (0.0, True),
    (bridged.PERSON_LATE - 0.5, True), (bridged.PERSON_LATE + 1.5, False)])
def test_a_persons_message_is_recognised_within_the_tolerance_only(archive, tmp_path, late,
                                                                   recognised):
    """The bridge stamps a message once its chat's turn begins: up to PERSON_LATE
    seconds after Telegram's time; earlier than it only by the clocks' difference."""
    turn(archive, PRIVATE, 7001, "see you at six", T0 + 1000 + late)
    report = import_file(archive, exported(tmp_path, tg(1, "see you at six", T0 + 1000)))
    assert report.duplicates == (1 if recognised else 0)


def test_a_reply_is_recognised_within_its_own_tolerance(archive, tmp_path):
    """The bridge archives a reply right after Telegram took it: BOT_LATE seconds."""
    late = bridged.BOT_LATE
    turn(archive, PRIVATE, 7001, "q", T0 + 0.5, "first answer", T0 + 1 + late - 1)
    turn(archive, PRIVATE, 7002, "q2", T0 + 100.5, "second answer", T0 + 101 + late + 2)
    source = exported(tmp_path, tg(1, "q", T0), tg(2, "first answer", T0 + 1, BOT),
                      tg(3, "q2", T0 + 100), tg(4, "second answer", T0 + 101, BOT))
    report = import_file(archive, source)
    assert (report.added, report.duplicates) == (1, 3)
    assert texts(archive, PRIVATE)[-1] == ("user", "second answer")   # the bot's, as a user



@pytest.mark.parametrize("early, recognised", [
    (bridged.BOT_EARLY - 1, True), (bridged.BOT_EARLY + 2, False)])
def test_a_reply_written_before_it_was_sent_is_recognised_within_bot_early(
        archive, tmp_path, early, recognised):
    """The bridge writes a reply, then sends it when its chat's pace allows: Telegram's
    time may be up to BOT_EARLY seconds after the archived one."""
    turn(archive, PRIVATE, 7001, "q", T0 + 0.5, "a late answer", T0 + 1000 - early)
    report = import_file(archive, exported(tmp_path, tg(2, "a late answer", T0 + 1000, BOT)))
    assert report.duplicates == (1 if recognised else 0)


def test_each_piece_of_a_long_reply_stands_for_one_exported_message(archive, tmp_path):
    """A reply over Telegram's limit went out in pieces: each exported piece (as
    Telegram showed its formatting, or as plain text where it refused that) is the
    archived reply's, once; the same piece exported twice is imported the second time."""
    from opencortex.bridges.outbound import split_text
    from opencortex.bridges.render import shown_text
    from opencortex.bridges.telegram import TEXT_LIMIT
    long = "\n\n".join(f"Part {i}, *bold*: " + "text " * 300 for i in range(6))
    pieces = split_text(long, TEXT_LIMIT)
    assert len(pieces) >= 3
    shown = [shown_text(piece) for piece in pieces[:-1]] + [pieces[-1]]    # the last plain
    assert shown[0] != pieces[0]
    turn(archive, PRIVATE, 7001, "q", T0 + 0.5, long, T0 + 1)
    source = exported(tmp_path, tg(1, "q", T0),
                      *(tg(2 + n, piece, T0 + 1 + n, BOT) for n, piece in enumerate(shown)),
                      tg(9, shown[0], T0 + 9, BOT))
    report = import_file(archive, source)
    assert (report.added, report.duplicates) == (1, 1 + len(pieces))
    assert texts(archive, PRIVATE)[-1] == ("user", shown[0].strip())

def test_in_a_supergroup_the_bots_replies_are_recognised_too(archive, tmp_path):
    """There the person's messages are found by their Telegram id; the bot's replies
    carry none and were imported again.  A message with an id the bridge did not
    archive is never taken for another one the bridge did."""
    turn(archive, GROUP, 7, "seven", T0 + 0.3, "noted", T0 + 2.2)
    source = exported(tmp_path, tg(7, "seven", T0), tg(8, "noted", T0 + 2, BOT),
                      tg(9, "seven", T0 + 1), chat_type="private_supergroup", chat_id=1234)
    report = import_file(archive, source)
    assert (report.added, report.duplicates) == (1, 2)
    assert texts(archive, GROUP)[-1] == ("user", "seven")
    assert archive.read_thread(GROUP)[-1].extra[PLATFORM_ID] == "9"


def test_named_as_the_assistant_the_bot_matches_replies_only(archive, tmp_path):
    """With --assistant naming the bot, its messages are the assistant's: they match
    the bridge's replies, never a person's message of the same text."""
    turn(archive, PRIVATE, 7001, "thanks", T0 + 0.4)
    source = exported(tmp_path, tg(1, "thanks", T0, BOT))
    report = import_file(archive, source, assistants=["Helper"])
    assert (report.added, report.duplicates) == (1, 0)
    assert texts(archive, PRIVATE)[-1] == ("assistant", "thanks")


def test_the_export_of_a_forum_finds_what_the_bridge_archived_in_its_topics(archive,
                                                                           tmp_path):
    """The bridge archives a forum's topics as threads of their own ("CHAT#TOPIC"); the
    export holds the whole group, and is imported into the group's thread: what the
    bridge archived in a topic is recognised there too (by its id, and the bot's
    replies by text and time), not brought in a second time."""
    topic = Thread("telegram", f"{GROUP.chat_id}#5")
    turn(archive, topic, 7, "in the topic", T0 + 0.3, "noted there", T0 + 2.2)
    turn(archive, GROUP, 10, "outside", T0 + 20.3, "noted", T0 + 22.2)
    source = exported(tmp_path, tg(6, "before", T0 - 60), tg(7, "in the topic", T0),
                      tg(8, "noted there", T0 + 2, BOT), tg(10, "outside", T0 + 20),
                      tg(11, "noted", T0 + 22, BOT), chat_type="private_supergroup",
                      chat_id=1234)
    report = import_file(archive, source)
    assert (report.added, report.duplicates) == (1, 4)
    assert texts(archive, topic) == [("user", "in the topic"), ("assistant", "noted there")]
    assert ("user", "before") in texts(archive, GROUP)
    other = Thread("telegram", "-10012345#5")       # another group's topic is not this one's
    assert other.chat != GROUP
