"""A turn's prompt costs the same whatever the length of the conversation.

The chat skill renders its thread's working context once per entry and keeps
it (`IncrementalFold`); each turn renders only what is new.  What it sends must
be exactly what rendering everything again would send: the same messages, in
the same order, however the context grew, was compressed or rewound between
turns, and whichever threads came between.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.config import ChatSettings
from opencortex.conversation.entries import Entry
from opencortex.events import chat_message
from opencortex.llm.base import PromptMessage, prompt_request
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.skills.incremental import IncrementalFold
from opencortex.tools import default_tools

REPO = Path(__file__).resolve().parents[1]
SKILLS = SkillRegistry([REPO / "skills"], default_tools())
SKILLS.load()
CHAT = SKILLS.get("chat")
SKILL = sys.modules[CHAT.module]          # the chat note's module, for its plain functions
LIMIT = 120                               # history-chars: short, so trimming shows


# -- the fold itself -------------------------------------------------------------------

def join_same_parity(acc: list, item: int, arg: int) -> None:
    """Fold ITEM + ARG onto ACC, adding it to the last number when both are even or odd."""
    value = item + arg
    if acc and acc[-1] % 2 == value % 2:
        acc[-1] += value
    else:
        acc.append(value)


def folded(items: list[int], arg: int) -> list[int]:
    acc: list[int] = []
    for item in items:
        join_same_parity(acc, item, arg)
    return acc


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["grow", "cut", "arg"]), st.integers(0, 3),
                                st.lists(st.integers(0, 9), max_size=4)), max_size=25))
def test_a_fold_kept_between_calls_equals_folding_everything(steps):
    fold = IncrementalFold(join_same_parity, keys=2)
    lists = {key: [] for key in "abc"}
    args = dict.fromkeys("abc", 0)
    for n, (what, amount, new) in enumerate(steps):
        key = "abc"[n % 3]                      # three keys, two remembered: one is evicted
        if what == "grow":
            lists[key] = lists[key] + new
        elif what == "cut":                     # a compression or a rewind
            lists[key] = lists[key][amount:] + new
        else:
            args[key] = amount
        result = fold(key, lists[key], args[key])
        assert result == folded(lists[key], args[key])
        result.append(99)                       # the caller's own list: nothing kept changes
    for key in "abc":
        assert fold(key, lists[key], args[key]) == folded(lists[key], args[key])


# -- the chat skill --------------------------------------------------------------------

ENTRY_KINDS = st.sampled_from([("user", "message"), ("assistant", "message"),
                               ("system", "message"), ("user", "summary")])
TEXTS = st.sampled_from(["hello", "what is the port?", "8443", "", "Thinking...",
                         "System Error: boom", "x" * 300 + " end", "ok", "Unknown request"])


def plain(ctx: SkillContext) -> list[PromptMessage]:
    """The messages the chat skill sends, rendered from scratch by its own functions."""
    history = [m for e in ctx.history if (m := SKILL.entry_message(e, LIMIT)) is not None]
    return SKILL.alternating([*SKILL.recalled_messages(ctx, LIMIT), *history,
                              PromptMessage(role="user", content=ctx.event.text)])


def context(thread: str, history: list[Entry], recalled: list[Entry], text: str
            ) -> SkillContext:
    chat = ChatSettings()
    return SkillContext(event=chat_message(text or "hi", "cli", thread),
                        history=list(history), recalled=recalled,
                        config={"buffer": chat.buffer, "allowed-buffers": [],
                                "history-chars": LIMIT})


@settings(max_examples=150, deadline=None)
@given(turns=st.lists(st.tuples(
    st.sampled_from(["t1", "t2"]),
    st.sampled_from(["grow", "grow", "grow", "compress", "rewind"]),
    st.lists(st.tuples(ENTRY_KINDS, TEXTS), min_size=1, max_size=3),
    st.lists(TEXTS, max_size=2), TEXTS), min_size=1, max_size=12))
def test_the_chat_prompt_renders_only_new_entries_and_equals_a_full_rendering(turns):
    histories: dict[str, list[Entry]] = {"t1": [], "t2": []}
    for n, (thread, change, added, recalled_texts, text) in enumerate(turns):
        history = histories[thread]
        if change == "compress" and history:        # the oldest folded into a summary
            summary = Entry(f"s{n}", "user", "earlier: " + history[0].text, 0,
                            kind="summary", covers=(history[0].id,))
            history = [summary, *history[1:]]
        elif change == "rewind":
            history = history[:len(history) // 2]
        history = history + [Entry(f"{thread}-{n}-{i}", role, body, n, kind=kind)
                             for i, ((role, kind), body) in enumerate(added)]
        histories[thread] = history
        recalled = [Entry(f"r{n}-{i}", "user", body, 0) for i, body in enumerate(recalled_texts)]
        ctx = context(thread, history, recalled, text)
        built = CHAT.probabilistic(ctx)
        assert built["messages"] == plain(ctx)
        assert prompt_request(built).messages == plain(ctx)


def test_each_entry_is_rendered_once_while_the_context_grows(monkeypatch):
    rendered: list[str] = []
    real = SKILL.entry_message
    monkeypatch.setattr(SKILL, "entry_message",
                        lambda entry, limit: rendered.append(entry.id) or real(entry, limit))
    history: list[Entry] = []
    for turn in range(1, 51):
        history = history + [Entry(f"q{turn}", "user", f"question {turn}", turn),
                             Entry(f"a{turn}", "assistant", f"answer {turn}", turn)]
        messages = CHAT.probabilistic(context("grows", history, [], "next"))["messages"]
        assert len(messages) == 2 * turn + 1
    assert len(rendered) == len(set(rendered)) == 100       # never rendered twice
    shorter = [replace(history[0], text="question 1, edited"), *history[1:]]
    CHAT.probabilistic(context("grows", shorter, [], "next"))
    assert len(rendered) == 200                             # changed: rendered anew, once
