"""The Matrix bridge's pieces that need no homeserver: reading events, HTML, positions,
the history cut, settings."""

from __future__ import annotations

import pytest

from opencortex.bridges.matrix import matrix_html
from opencortex.bridges.matrix_events import reaction_answer, read_event, strip_reply_fallback
from opencortex.bridges.matrix_session import arrival
from opencortex.bridges.matrix_state import MatrixState
from opencortex.bridges.runner import PLATFORMS
from opencortex.bridges.settings import BridgesSettings, MatrixSettings


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
    class Event:
        def __init__(self, source):
            self.source = source
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
