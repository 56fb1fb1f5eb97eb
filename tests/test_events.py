from datetime import datetime, timezone

import pytest

from opencortex.events import ChatMessage, EventError, Thread, chat_message, parse_event


def test_chat_message_has_a_thread():
    event = chat_message("hello", "telegram", "42", sender="ann")
    assert event.thread == Thread("telegram", "42")
    assert str(event.thread) == "telegram:42"
    assert event.received_at.tzinfo is not None


@pytest.mark.parametrize("data, fragment", [
    ({"text": "", "channel": "cli", "chat_id": "x"}, "text"),
    ({"text": "   \n", "channel": "cli", "chat_id": "x"}, "blank"),
    ({"text": "hi", "channel": "irc", "chat_id": "x"}, "channel"),
    ({"text": 5, "channel": "cli", "chat_id": "x"}, "text"),
    ({"text": "hi", "channel": "cli", "chat_id": 7}, "chat_id"),
    ({"text": "hi", "channel": "cli", "chat_id": "a\nb"}, "single line"),
    ({"text": "hi", "channel": "cli"}, "chat_id"),
    ({"text": "hi", "channel": "cli", "chat_id": "x", "evil": 1}, "evil"),
    ({"kind": "timer", "text": "hi", "channel": "cli", "chat_id": "x"}, "unknown event kind"),
    ("not a mapping", "mapping"),
])
def test_invalid_events_are_refused_with_the_reason(data, fragment):
    with pytest.raises(EventError) as caught:
        parse_event(data)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("name, kept", [
    ("Alice Smith", "Alice Smith"),
    ("  Ann\n\x1b[31mRed\u202e\t ", "Ann [31mRed"),        # one line, no controls
    ("\ud800 Bo", "Bo"),                                     # a lone surrogate is dropped
    ("x" * 300, "x" * 256),                                  # cut, not refused
    (" \n\t", None), ("", None), (None, None),
])
def test_a_display_name_is_one_clean_line_and_never_refuses_the_message(name, kept):
    assert chat_message("hi", "telegram", "42", "7", sender_name=name).sender_name == kept


def test_a_display_name_must_be_text():
    with pytest.raises(EventError, match="sender_name"):
        parse_event({"text": "hi", "channel": "cli", "chat_id": "x", "sender_name": 5})


def test_epoch_arrival_time_is_accepted():
    event = parse_event({"text": "hi", "channel": "emacs", "chat_id": "c", "received_at": 0})
    assert event.received_at == datetime(1970, 1, 1, tzinfo=timezone.utc)


def test_events_are_immutable():
    event = chat_message("hi")
    with pytest.raises(Exception):
        event.text = "changed"  # type: ignore[misc]
    assert isinstance(event, ChatMessage)


@pytest.mark.parametrize("text, expected", [
    ("cli:local", Thread("cli", "local")),
    ("matrix:!room:example.org", Thread("matrix", "!room:example.org")),
    ("someone", Thread("cli", "someone")),
])
def test_thread_parse(text, expected):
    assert Thread.parse(text) == expected


@pytest.mark.parametrize("text", ["irc:x", "cli:", "cli:  "])
def test_thread_parse_refuses(text):
    with pytest.raises(EventError):
        Thread.parse(text)
