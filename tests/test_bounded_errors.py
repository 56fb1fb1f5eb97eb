"""What a verdict quotes stays small and printable, whatever the reply (issue 8 §2, §3)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.events import chat_message
from opencortex.excerpt import clip, excerpt
from opencortex.reader import Keyword, Symbol
from opencortex.skills import Rejection, Skill, SkillContext, SkillRegistry
from opencortex.tools import default_tools
from opencortex.verification import (ERRORS_BUDGET, MAX_ERRORS, REASON_LIMIT, Verdict, bounded,
                                     judge)

REPO = Path(__file__).resolve().parents[1]
CTX = SkillContext(event=chat_message("hi", "emacs", "local"),
                   config={"buffer": "*opencortex-chat*", "allowed-buffers": [],
                           "history-chars": 1000})


def chat_skills() -> list[Skill]:
    registry = SkillRegistry([REPO / "skills"])
    registry.load()
    return registry.skills


def test_excerpt_prints_plist_data_and_cuts_it():
    assert excerpt({"a": [Keyword("k"), Symbol("s"), 1, 2.5, "x", None, True]}) == \
        '(:a (:k s 1 2.5 "x" nil t))'
    assert excerpt({}) == "()"
    assert excerpt(object()) == "<object>"
    cut = excerpt(list(range(1_000_000)), 30)
    assert len(cut) == 30 and cut.startswith("(0 1 2") and cut.endswith("…")
    assert excerpt(10 ** 400) == "<a very large number>"


def test_excerpt_and_clip_make_lone_surrogates_printable():
    assert excerpt("caf\udce9") == '"caf\ufffd"'
    assert clip("\ud800" * 5, 3) == "\ufffd\ufffd…"
    excerpt({"k\udcff": ["\udcff" * 100]}, 50).encode("utf-8")


def test_verdict_errors_are_bounded_in_number_and_size():
    verdict = Verdict("rejected", errors=["e" * 5000] * 50)
    assert len(verdict.errors) <= MAX_ERRORS + 1
    assert all(len(error) <= REASON_LIMIT for error in verdict.errors)
    assert sum(map(len, verdict.errors)) <= ERRORS_BUDGET + 100
    assert verdict.errors[-1].startswith("and ") and "more" in verdict.errors[-1]
    assert bounded(["a", "b"]) == ["a", "b"]


def test_a_skill_that_quotes_the_whole_action_is_cut_short():
    skills = chat_skills()
    reply = ('(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*elsewhere*" '
             f':text "{"z" * 200_000}")')
    verdict = judge(reply, skills, CTX, default_tools())
    assert verdict.status == "rejected"
    assert verdict.errors[0].startswith("Chat agent returned invalid action: (:type")
    assert len(verdict.errors[0]) <= REASON_LIMIT


def test_a_verifier_that_writes_a_huge_reason_is_cut_short():
    loud = Skill(name="loud", trigger=lambda ctx: True,
                 deterministic=lambda action, ctx: Rejection("no! " * 100_000))
    verdict = judge('(:type :RESPONSE :text "hi")', [loud], CTX)
    assert len(verdict.errors) == 1 and len(verdict.errors[0]) <= REASON_LIMIT


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.sampled_from(["(:type :REQUEST :target :shell :cmd ({}))",
                        "(:type :REQUEST :target :cli :text \"x\" {})",
                        "(:type :REQUEST :target :tool :action :call :tool \"clock\" :args ({}))"]),
       st.integers(1, 9_000), st.sampled_from(["1", "s", ":k 1", "(1)", '"t"']))
def test_judging_many_bad_items_says_a_few_kb_at_most(shape, count, item):
    items = " ".join(item.replace("k", f"k{i}") for i in range(count))
    verdict = judge(shape.format(items), chat_skills_once(), CTX, default_tools())
    assert sum(map(len, verdict.errors)) <= ERRORS_BUDGET + 100
    "; ".join(verdict.errors).encode("utf-8")  # printable as it is


_SKILLS: list[Skill] = []


def chat_skills_once() -> list[Skill]:
    """The bundled skills, loaded once for the property test."""
    if not _SKILLS:
        _SKILLS.extend(chat_skills())
    return _SKILLS


def test_bounding_twice_changes_nothing():
    for errors in (["e" * 900] * 7, ["x"] * 30, [f"r{i}" for i in range(10)] +
                   ["and 5 more problems like these"]):
        once = bounded(errors)
        assert bounded(once) == once
    assert bounded([f"r{i}" for i in range(10)] + ["and 5 more problems like these"])[-1] == \
        "and 5 more problems like these"
