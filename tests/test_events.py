from datetime import datetime, timedelta, timezone

import pytest

from opencortex.events import (MAX_QUEUED, ChatMessage, EventError, Thread, chat_message,
                               parse_event, platform_time)


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


@pytest.mark.parametrize("sent, believed", [
    (None, False),                                    # the platform said nothing
    (timedelta(hours=-1), True),                      # it waited an hour: dated then
    (-MAX_QUEUED + timedelta(minutes=1), True),
    (-MAX_QUEUED - timedelta(minutes=1), False),      # a sender's client may say anything
    (timedelta(seconds=5), False),                    # after it came: not believed
])
def test_a_message_is_dated_by_the_platforms_send_time_within_bounds(sent, believed):
    received = datetime(2026, 11, 28, 12, tzinfo=timezone.utc)
    event = chat_message("hi", "signal", "+1555").model_copy(update={
        "received_at": received, "sent_at": None if sent is None else received + sent})
    assert event.said_at == (received + sent if believed else received)


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 1e20, True, "1700000000",
                                     None])
def test_a_platform_time_that_is_no_time_is_none(seconds):
    assert platform_time(seconds) is None


def test_a_platform_time_is_an_aware_datetime():
    assert platform_time(1_700_000_000.5) == datetime(2023, 11, 14, 22, 13, 20, 500000,
                                                      tzinfo=timezone.utc)
