"""Fuzzing the reader and the judge (issue 8 §2, §3, §9).

Whatever a model sends, judging returns a verdict, never an exception; each
input is judged within a generous bound; what the verdict says stays a few KB;
and every reply that is accepted can be archived and read back exactly.
Fixed budget: derandomized, a few hundred examples per property.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencortex.events import Thread, chat_message
from opencortex.memory import Archive, NewMessage
from opencortex.reader import Keyword, Symbol, print_plist, print_value, read_plist
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.tools import default_tools
from opencortex.verification import ERRORS_BUDGET, REASON_LIMIT, Verdict, judge

REPO = Path(__file__).resolve().parents[1]
PER_INPUT_SECONDS = 2.0   # generous: the point is "bounded", not "fast"
BUFFER = "*opencortex-chat*"
FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TOOLS = default_tools()
SKILLS = SkillRegistry([REPO / "skills"])
SKILLS.load()

# One valid reply per target and type.
VALID_REPLIES = [
    f'(:type :REQUEST :target :emacs :action :insert-at-end :buffer "{BUFFER}" '
    ':text "* Title\\nBody")',
    '(:type :REQUEST :target :telegram :chat-id "42" :text "hi")',
    '(:type :REQUEST :target :signal :chat-id "+100" :text "hi")',
    '(:type :REQUEST :target :matrix :room-id "!r:x" :text "hi")',
    '(:type :REQUEST :target :cli :text "hi \\"there\\"")',
    '(:type :REQUEST :target :tool :action :call :tool "clock")',
    '(:type :REQUEST :target :tool :action :call :tool "clock" :args ())',
    '(:type :REQUEST :target :shell :cmd ("ls" "-l") :reason "look")',
    '(:type :RESPONSE :text "hi")',
    '(:type :LOG :text "noted" :level :info)',
]


def context(channel: str = "emacs", chat_id: str = "local") -> SkillContext:
    """A turn's context on CHANNEL, with the default tools and chat settings."""
    return SkillContext(event=chat_message("hi", channel, chat_id),
                        config={"buffer": BUFFER, "allowed-buffers": [],
                                "history-chars": 1000},
                        tools=TOOLS.descriptions())


CONTEXT = context()


def judged(text: str) -> Verdict:
    """Judge TEXT as a turn does; check it is a bounded verdict, found in bounded time."""
    started = time.perf_counter()
    verdict = judge(text, SKILLS.skills, CONTEXT, TOOLS)
    spent = time.perf_counter() - started
    assert spent < PER_INPUT_SECONDS, f"{spent:.2f} s for {len(text)} characters"
    assert isinstance(verdict, Verdict)
    assert verdict.status in ("accepted", "rejected", "needs-approval")
    assert (verdict.status == "rejected") == bool(verdict.errors)
    assert sum(len(error) for error in verdict.errors) <= ERRORS_BUDGET + 100
    assert all(len(error) <= REASON_LIMIT for error in verdict.errors)
    for error in verdict.errors:
        error.encode("utf-8")  # printable and storable as it is
    if verdict.action is not None:
        verdict.action.printed()
    return verdict


# ---------------------------------------------------------- grammar-built plists

KEYS = st.sampled_from(["type", "target", "action", "buffer", "text", "chat-id", "room-id",
                        "tool", "args", "cmd", "reason", "cwd", "level", "approved", "x"])
KEYWORDS = st.sampled_from(["request", "response", "log", "emacs", "telegram", "signal",
                            "matrix", "cli", "tool", "shell", "call", "insert-at-end",
                            "info", "eval"]).map(Keyword)
SCALARS = st.one_of(
    KEYWORDS, st.text(max_size=30), st.sampled_from([BUFFER, "clock", "42", "ls"]),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(), st.none(),
    st.from_regex(r"x[a-z0-9-]{0,6}", fullmatch=True).map(Symbol))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=6),
                            st.dictionaries(KEYS, inner, min_size=1, max_size=4)),
    max_leaves=25)
SKELETONS = [read_plist(reply) for reply in VALID_REPLIES]


@st.composite
def near_valid(draw: st.DrawFn) -> dict:
    """A valid action with a few keys dropped, changed or added."""
    form = dict(draw(st.sampled_from(SKELETONS)))
    for key in draw(st.lists(st.sampled_from(sorted(form)), max_size=2)):
        form.pop(key, None)
    form.update(draw(st.dictionaries(KEYS, VALUES, max_size=2)))
    return form or {"type": Keyword("log")}


PLISTS = st.one_of(st.dictionaries(KEYS, VALUES, min_size=1, max_size=8), near_valid())


@FUZZ
@given(PLISTS, st.sampled_from(["", "Sure:\n```lisp\n", "#", "#.", "'"]))
def test_grammar_built_plists_get_a_verdict(form, prefix):
    verdict = judged(prefix + print_plist(form))
    if prefix.startswith("#"):
        assert verdict.status == "rejected"


@FUZZ
@given(st.lists(st.one_of(KEYS.map(lambda k: ":" + k), SCALARS.map(print_value),
                          st.sampled_from(["(", ")", "[", "]", '"', ";", "#", "\\", "`",
                                           ",", "'", "?", ".", "```", "\n", "(:type"])),
                max_size=60))
def test_token_soup_gets_a_verdict(tokens):
    judged("(:type " + " ".join(tokens))


# ------------------------------------------------------ byte mutations of replies

MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "repeat"]),
                               st.integers(min_value=0), st.integers(0, 255)),
                     min_size=1, max_size=6)


def mutate(data: bytes, steps: list[tuple[str, int, int]]) -> bytes:
    """DATA with each (operation, where, byte) step applied."""
    buffer = bytearray(data)
    for operation, where, byte in steps:
        at = where % (len(buffer) + 1)
        if operation == "flip" and at < len(buffer):
            buffer[at] ^= byte or 1
        elif operation == "insert":
            buffer[at:at] = bytes([byte])
        elif operation == "delete":
            del buffer[at:at + 1 + byte % 4]
        elif operation == "repeat":
            buffer[at:at] = buffer[at:at + 1 + byte % 16] * (1 + byte % 8)
    return bytes(buffer)


@FUZZ
@given(st.sampled_from(VALID_REPLIES), MUTATIONS)
def test_byte_mutations_of_valid_replies_get_a_verdict(reply, steps):
    text = mutate(reply.encode("utf-8"), steps).decode("utf-8", "surrogateescape")
    verdict = judged(text)
    if any(0xDC80 <= ord(char) <= 0xDCFF for char in text):
        assert verdict.status == "rejected"  # undecodable bytes are never accepted


@pytest.mark.parametrize("reply", VALID_REPLIES)
def test_every_valid_reply_is_accepted_or_needs_approval(reply):
    verdict = judged(reply)
    expected = "needs-approval" if ":shell" in reply else "accepted"
    assert verdict.status == expected, verdict.errors


# ------------------------------------------ accepted replies survive the archive

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=200)
SAYING = [  # the reply forms that say text, with {} for the text
    f'(:type :REQUEST :target :emacs :action :insert-at-end :buffer "{BUFFER}" :text {{}})',
    "(:type :REQUEST :target :cli :text {})",
    "(:type :RESPONSE :text {})",
    "(:type :LOG :text {})",
]


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    with Archive(tmp_path_factory.mktemp("memory")) as opened:
        yield opened


@FUZZ
@given(text=ANY_TEXT, shape=st.sampled_from(SAYING), around=st.booleans())
def test_every_accepted_reply_is_archived_and_read_back_exactly(archive, text, shape, around):
    reply = shape.format(print_value(text))
    if around:
        reply = f"Here it is:\n```lisp\n{reply}\n```"
    verdict = judged(reply)
    if verdict.status != "accepted":
        assert any(0xD800 <= ord(char) <= 0xDFFF for char in text), verdict.errors
        return
    said = verdict.action.text
    assert said == text
    thread = Thread("cli", f"fuzz-{next(COUNTER)}")
    archive.append([NewMessage(role="assistant", text=said, thread=thread)])
    assert [record.text for record in archive.read_thread(thread)] == [said]


COUNTER = itertools.count()
