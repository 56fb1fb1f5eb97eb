"""The session state machine: checked transitions, limits that collapse, reset, restore."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.conversation.session import (ALLOWED, SESSION_STATES, InvalidTransition,
                                             Session)
from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

LOCAL = Thread("cli", "local")

EXPECTED = {
    ("dormant", "ready"), ("ready", "streaming"), ("streaming", "waiting"),
    ("streaming", "ready"), ("streaming", "draining"), ("waiting", "streaming"),
    ("waiting", "ready"), ("waiting", "draining"), ("draining", "ready"),
    ("draining", "dormant"), ("ready", "dormant"),
} | {(state, "collapsed") for state in SESSION_STATES}


def session_in(state: str) -> Session:
    session = Session(LOCAL)
    session.state = state
    return session


@pytest.mark.parametrize("source", SESSION_STATES)
@pytest.mark.parametrize("target", SESSION_STATES)
def test_every_transition_is_checked(source, target):
    session = session_in(source)
    if (source, target) in EXPECTED:
        session.to(target)
        assert session.state == target
    else:
        with pytest.raises(InvalidTransition, match=f"cannot go from {source} to {target}"):
            session.to(target)
        assert session.state == source


def test_the_table_matches_the_contract():
    table = {(a, b) for a, targets in ALLOWED.items() for b in targets}
    assert table | {(s, "collapsed") for s in SESSION_STATES} == EXPECTED


def test_unknown_states_are_refused():
    with pytest.raises(ValueError, match="unknown session state"):
        Session(LOCAL).to("sleeping")
    with pytest.raises(ValueError, match="unknown session state"):
        Session(LOCAL, state="sleeping")


def test_collapsed_is_left_only_by_reset():
    session = Session(LOCAL, state="ready")
    session.collapse("the budget is used up")
    with pytest.raises(InvalidTransition, match="use reset"):
        session.to("ready")
    assert session.collapse_reason == "the budget is used up"
    session.collapse("another reason")
    assert session.collapse_reason == "the budget is used up"      # the first reason stays
    session.reset()
    assert (session.state, session.turns, session.tokens, session.collapse_reason) == (
        "ready", 0, 0, None)


def test_turn_limit_collapses_with_a_reason():
    session = Session(LOCAL, state="ready")
    assert session.count_turn(100, max_turns=2) is None
    reason = session.count_turn(100, max_turns=2)
    assert session.state == "collapsed" and reason == session.collapse_reason
    assert "limit of 2 turns" in reason and "/reset" in reason
    assert session.count_turn(5, max_turns=2) == reason                # nothing more counts
    assert (session.turns, session.tokens) == (2, 200)


def test_token_budget_collapses_with_a_reason():
    session = Session(LOCAL, state="ready")
    assert session.count_turn(600, max_tokens=1000) is None
    reason = session.count_turn(500, max_tokens=1000)
    assert session.state == "collapsed"
    assert "1,100 of its 1,000 tokens" in reason
    assert Session(LOCAL).count_turn(10**6) is None                    # no limits, no collapse
    with pytest.raises(ValueError):
        Session(LOCAL).count_turn(-1)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.sampled_from(SESSION_STATES + ("reset",)), max_size=40))
def test_random_walks_only_take_allowed_steps(steps):
    session = Session(LOCAL)
    for step in steps:
        before = session.state
        if step == "reset":
            session.reset()
            assert session.state == "ready"
            continue
        try:
            session.to(step)
        except InvalidTransition:
            assert (before, step) not in EXPECTED and session.state == before
        else:
            assert (before, step) in EXPECTED and session.state == step
        assert (session.state == "collapsed") == (session.collapse_reason is not None)


def test_session_is_rebuilt_from_the_archive_after_a_restart(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        for n in range(3):
            log.append_turn([
                NewMessage(role="user", text=f"q{n}", thread=LOCAL),
                NewMessage(role="assistant", text=f"a{n}", thread=LOCAL,
                           extra={"TOKENS_IN": "100", "TOKENS_OUT": "20", "TURN": str(n + 1)})])
    with Archive(root) as archive:
        log = ThreadLog.load(archive, LOCAL)
        session = Session.from_log(log)
        assert (session.state, session.turns, session.tokens) == ("dormant", 3, 360)
        spent = Session.from_log(log, max_tokens=300)
        assert spent.state == "collapsed" and "360 of its 300 tokens" in spent.collapse_reason
