"""Small talk is told apart by regular expressions, never a loop over the characters:
it runs on the event loop for every message, and a message may hold megabytes
(a 2 MB message blocked every conversation for ~150 ms)."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from opencortex.conversation import entries
from opencortex.conversation.entries import is_chit_chat


def python_calls_during(function, *args) -> int:
    """How many Python frames (generator resumptions included) FUNCTION(*ARGS) ran."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1
    sys.setprofile(count)
    try:
        function(*args)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("text", ["y" * 100_000, "🙂" * 100_000, "thanks " + "é" * 100_000])
def test_a_long_message_costs_no_python_step_per_character(text):
    assert python_calls_during(is_chit_chat, text) < 100


def test_the_expressions_match_what_the_character_loops_meant():
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        assert (entries._LETTER_OR_DIGIT.search(char) is not None) == \
            unicodedata.category(char).startswith(("L", "N")), hex(code)
        assert (entries._DIGIT.search(char) is not None) == char.isdigit(), hex(code)


@pytest.mark.parametrize("text,small_talk", [
    ("thanks!", True), ("ok", True), ("🙂🙂", True), ("no worries", True), ("", True),
    ("thanks ²", False), ("thanks ①", False), ("ok 3", False), ("what is a heron", False),
    ("🙂" * 100, True), ("🙂" * 300, False), ("thanks" + " " * 500, True)])
def test_small_talk_is_told_as_before(text, small_talk):
    assert is_chit_chat(text) is small_talk


def test_a_long_message_is_never_read_whole(monkeypatch):
    """Small talk is short: a 2 MB message took ~100 ms of the loop in regular
    expressions that read all of it (the loop held every conversation meanwhile)."""
    read: list[int] = []

    class Noting:
        def __init__(self, pattern):
            self.pattern = pattern

        def __getattr__(self, name):
            def call(text, *args):
                read.append(len(text))
                return getattr(self.pattern, name)(text, *args)
            return call
    for name in ("_LETTER_OR_DIGIT", "_CODE_HINT", "_DIGIT", "_NO_TROUBLE", "_WORD"):
        monkeypatch.setattr(entries, name, Noting(getattr(entries, name)))
    assert is_chit_chat("x" * 2_000_000) is False
    assert is_chit_chat("thanks!") is True and read and max(read) < 100
