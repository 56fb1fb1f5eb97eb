"""The Matrix bridge's pieces that need no homeserver: reading events, HTML, positions,
the history cut, settings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.bridges.inbound import from_milliseconds
from opencortex.bridges.matrix import matrix_html
from opencortex.bridges.matrix_events import (RoomEvent, reaction_answer, read_event,
                                              strip_reply_fallback)
from opencortex.bridges.matrix_session import arrival
from opencortex.bridges.matrix_state import MatrixState
from opencortex.bridges.runner import PLATFORMS
from opencortex.bridges.settings import BridgesSettings, MatrixSettings


class Event:
    """A timeline event as `arrival` reads it: its JSON only."""

    def __init__(self, source: dict):
        self.source = source


def message(content: dict, kind: str = "m.room.message", **extra) -> dict:
    return {"type": kind, "event_id": "$e", "sender": "@a:x", "content": content, **extra}


def test_reading_events():
    text = read_event(message({"msgtype": "m.text", "body": "> <@b:x> quoted\n> more\n\napprove",
                               "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}},
                               "m.mentions": {"user_ids": ["@bot:x"]}}))
    assert (text.kind, text.text, text.reply_to, text.mentions) == \
        ("text", "approve", "$q", ("@bot:x",))
    threaded = read_event(message({"msgtype": "m.text", "body": "in", "m.relates_to": {
        "rel_type": "m.thread", "event_id": "$root", "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$last"}}}))
    assert (threaded.thread_root, threaded.reply_to, threaded.text) == ("$root", "", "in")
    edit = read_event(message({"msgtype": "m.text", "body": "* x",
                               "m.relates_to": {"rel_type": "m.replace", "event_id": "$o"}}))
    assert edit.kind == "edit"
    assert read_event(message({"msgtype": "m.image", "body": "cat.png"})).text == ""
    captioned = read_event(message({"msgtype": "m.image", "body": "look", "filename": "c.png"}))
    assert (captioned.kind, captioned.text) == ("media", "look")
    assert read_event(message({"msgtype": "m.notice", "body": "a bot"})).kind == "other"
    assert read_event(message({}, "m.room.redaction")).kind == "deletion"
    assert read_event(message({"membership": "join"}, "m.room.member", state_key="@a:x")) is None
    assert read_event({"type": "m.room.message", "content": "not a dict"}) is None
    reaction = read_event(message({"m.relates_to": {"rel_type": "m.annotation",
                                                    "event_id": "$asked", "key": "✅\ufe0f"}},
                                  "m.reaction"))
    assert (reaction.kind, reaction.reacts_to) == ("reaction", "$asked")
    assert reaction_answer(reaction.reaction) is True and reaction_answer("❌") is False
    assert reaction_answer("👍") is None and reaction_answer("") is None


# Any JSON, shaped like events often enough that the fuzzing reaches every field read.
TEXTS = st.sampled_from(["m.room.message", "m.reaction", "m.room.redaction", "m.sticker",
                         "m.room.member", "m.text", "m.image", "m.thread", "m.replace",
                         "m.annotation", "join", "invite", "@bot:x", "$e", "> q\n\nx", "✅"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | TEXTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3) | TEXTS,
                                                                inner, max_size=3),
    max_leaves=12)


def shaped(keys: str, values=JSON):
    """Objects holding some of KEYS, each one of VALUES; or any JSON at all."""
    return st.dictionaries(st.sampled_from(keys.split()), values, max_size=4) | JSON


RELATION = shaped("rel_type event_id m.in_reply_to is_falling_back key",
                  TEXTS | shaped("event_id"))
CONTENT = shaped("msgtype body filename m.relates_to m.mentions membership",
                 TEXTS | RELATION | shaped("user_ids"))
KINDS = st.sampled_from(["m.room.message", "m.reaction", "m.room.redaction", "m.sticker",
                         "m.room.member"])
EVENTS = st.fixed_dictionaries({"type": KINDS, "event_id": st.just("$e"),
                                "sender": st.just("@a:x"), "content": CONTENT})
ANY_EVENTS = st.fixed_dictionaries(
    {"type": KINDS | JSON, "event_id": JSON, "sender": JSON, "content": CONTENT},
    optional={"state_key": st.just("@bot:x") | JSON})
MEMBERSHIPS = st.fixed_dictionaries(
    {"type": st.just("m.room.member") | JSON, "content": CONTENT},
    optional={"state_key": st.just("@bot:x") | JSON,
              "unsigned": shaped("prev_content", CONTENT)})


@settings(max_examples=400, deadline=None, derandomize=True)
@given(EVENTS | ANY_EVENTS)
def test_any_json_event_reads_as_a_room_event_or_none(source):
    """An event's content is what its sender's client wrote (Synapse checks only plain
    messages of its own users): a `msgtype` that was an object raised TypeError."""
    seen = read_event(source)
    assert seen is None or isinstance(seen, RoomEvent)
    if seen is not None:
        assert all(isinstance(value, str) for value in (
            seen.event_id, seen.sender, seen.text, seen.thread_root, seen.reply_to,
            seen.reacts_to, seen.reaction, *seen.mentions))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(MEMBERSHIPS | ANY_EVENTS, max_size=5))
def test_the_history_cut_reads_any_json_timeline(sources):
    assert 0 <= arrival([Event(source) for source in sources], "@bot:x") <= len(sources)


def test_a_message_whose_fields_have_other_types_is_read_without_them():
    odd = read_event(message({"msgtype": {"not": "text"}, "body": 7,
                              "m.relates_to": ["a"], "m.mentions": "all"}))
    assert (odd.kind, odd.text, odd.mentions) == ("other", "", ())
    listed = read_event(message({"msgtype": ["m.text"], "body": "x"}))
    assert listed.kind == "other"
    reply = read_event(message({"msgtype": "m.text", "body": "x",
                                "m.relates_to": {"m.in_reply_to": {"event_id": 5}}}))
    assert (reply.kind, reply.reply_to) == ("text", "")


def test_a_timestamp_is_read_only_when_it_is_a_whole_number_json_carries_exactly():
    assert from_milliseconds(1_795_950_539_580) == 1_795_950_539.58
    assert from_milliseconds(-5) == -0.005          # the kernel decides what it believes
    assert [from_milliseconds(odd) for odd in (10 ** 400, 2 ** 53 + 1, True, 1.5, "1")] \
        == [None] * 5


def test_reply_fallback_and_html_line_breaks():
    assert strip_reply_fallback("plain") == "plain"
    assert strip_reply_fallback("> <@b:x> hi\n\ndeny") == "deny"
    assert strip_reply_fallback("> only a quote") == ""
    assert matrix_html("a\n<b>b</b>\n<pre>x\ny</pre>\nz") == "a<br/><b>b</b><br/><pre>x\ny</pre><br/>z"


def test_positions_are_stable_for_a_seen_event_and_grow_for_new_ones(tmp_path):
    state = MatrixState(tmp_path / "m")
    first, before = state.positions(["$a", "$b"])
    assert before == set() and first["$b"] == first["$a"] + 1
    state.close()
    state = MatrixState(tmp_path / "m")                 # after a restart
    again, before = state.positions(["$b", "$c"])
    assert before == {"$b"} and again["$b"] == first["$b"] and again["$c"] > first["$b"]
    state.put(next_batch="s1", access_token="")
    assert state.get("next_batch") == "s1" and state.get("access_token") == ""
    state.close()


def test_history_before_the_bots_invite_is_not_its_business():
    me = "@bot:x"
    invite = Event({"type": "m.room.member", "state_key": me, "content": {"membership": "invite"}})
    join = Event({"type": "m.room.member", "state_key": me, "content": {"membership": "join"},
                  "unsigned": {"prev_content": {"membership": "invite"}}})
    said = Event({"type": "m.room.message", "content": {}})
    assert arrival([said, invite, said, join, said], me) == 2
    assert arrival([said, said], me) == 0
    alone = Event({"type": "m.room.member", "state_key": me, "content": {"membership": "join"}})
    assert arrival([said, alone, said], me) == 2


def test_matrix_settings_check_ids_and_the_account():
    with pytest.raises(ValueError, match="not a Matrix user id"):
        MatrixSettings(allow=["12345"])
    with pytest.raises(ValueError, match="not a Matrix room id"):
        MatrixSettings(groups=["#alias:x"])
    with pytest.raises(ValueError, match="homeserver must be"):
        MatrixSettings(enabled=True, user_id="@bot:x")
    with pytest.raises(ValueError, match="user_id must be"):
        MatrixSettings(enabled=True, homeserver="https://x")
    settings = MatrixSettings(enabled=True, homeserver="https://x", user_id="@bot:x",
                              groups=["!v12roomid", "!old:x"])
    assert settings.secret_envs() == ["OPENCORTEX_MATRIX_TOKEN", "OPENCORTEX_MATRIX_PASSWORD"]
    assert "matrix" in PLATFORMS and "matrix" in BridgesSettings.model_fields
