"""A reasoning model's thinking, through the real SDKs against the fake provider: its
words come as `Thinking` (never text of the reply), keep the stream alive, start
anew on a retried request, and Claude's `thinking` setting is sent as the API
documents it.

Before, Claude's thinking blocks were read as silence: a model thinking longer
than `first_chunk_timeout` failed the turn with STREAM_TIMEOUT, and no
backend passed a reasoning model's words on.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from opencortex.llm import LLMError, Thinking, Usage
from opencortex.llm.settings import AnthropicSettings, LLMSettings

from llm_fakes import Reply
from test_llm_malformed import anthropic_events, openai_events, stream, thinking
from test_llm_providers import FAST, collect, fake, fresh_queue, loop, make  # noqa: F401

TEXT = "Hello there"
THOUGHTS = ["Let me see: ", "the person says hello.\n", "* not a heading\n#+end_thinking"]


def claude_thinking(thoughts: list[str], *, redacted: bool = False, then_text: bool = True,
                    error: str | None = None) -> list[tuple[str | None, str]]:
    """A Messages stream as the API documents it with thinking on: a thinking block of
    THOUGHTS (its signature last; REDACTED: a redacted block instead), then the text
    block, unless THEN_TEXT is false and ERROR names the error event that ends it."""
    events = anthropic_events(TEXT)
    start, text_block = events[0], events[1:4]
    block: list[tuple[str, object]]
    if redacted:
        block = [("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "redacted_thinking",
                                                            "data": "EmwKAhgBEgy3va"}})]
    else:
        block = [("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "thinking", "thinking": "",
                                                            "signature": ""}})]
        block += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "thinking_delta", "thinking": t}})
                  for t in thoughts]
        block += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "signature_delta",
                                                     "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}})]
    block += [("content_block_stop", {"type": "content_block_stop", "index": 0})]
    if not then_text:
        ended = [("error", {"type": "error", "error": {"type": error or "overloaded_error",
                                                        "message": "Overloaded"}})]
        return [(event, json.dumps(data)) for event, data in [start, *block, *ended]]
    for _, data in text_block:
        data["index"] = 1
    return [(event, json.dumps(data)) for event, data in [start, *block, *text_block,
                                                           *events[4:]]]


def split(items: list) -> tuple[str, list[Thinking]]:
    """The reply's text and the Thinking items among ITEMS (a Usage last)."""
    assert isinstance(items[-1], Usage)
    return ("".join(item for item in items[:-1] if isinstance(item, str)),
            [item for item in items if isinstance(item, Thinking)])


def test_claudes_thinking_comes_as_thinking_never_as_text(make, fake, loop):
    fake.push(Reply(raw=claude_thinking(THOUGHTS)))
    text, thoughts = split(collect(loop, make("anthropic")))
    assert text == TEXT
    assert [t.text for t in thoughts] == THOUGHTS
    assert [t.fresh for t in thoughts] == [True, False, False]


def test_claude_thinking_longer_than_the_first_chunk_timeout_is_not_a_stall(make, fake, loop):
    """1.2 s of thinking before any text, first_chunk_timeout 0.5 s: before, STREAM_TIMEOUT."""
    quick = FAST.model_copy(update={"first_chunk_timeout": 0.5, "stall_timeout": 1.0})
    fake.push(Reply(raw=claude_thinking(["hmm, "] * 10), delay=0.1))
    text, thoughts = split(collect(loop, make("anthropic", quick)))
    assert text == TEXT and len(thoughts) == 10


def test_a_redacted_thinking_block_keeps_the_stream_alive_with_nothing_to_show(make, fake,
                                                                             loop):
    fake.push(Reply(raw=claude_thinking([], redacted=True)))
    text, thoughts = split(collect(loop, make("anthropic")))
    assert text == TEXT and thoughts == []


def test_a_retried_request_thinks_anew(make, fake, loop):
    """Overloaded after some thinking and before any text: retried (nothing of the reply
    was shown), and the retry's first thought is fresh, so the earlier one goes."""
    fake.push(Reply(raw=claude_thinking(["first try"], then_text=False)),
              Reply(raw=claude_thinking(["second ", "try"])))
    text, thoughts = split(collect(loop, make("anthropic")))
    assert text == TEXT
    assert [(t.text, t.fresh) for t in thoughts] == [("first try", True), ("second ", True),
                                                     ("try", False)]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_servers_reasoning_field_comes_as_thinking(field, make, fake, loop):
    fake.push(Reply(raw=thinking(field, 3) + stream("openai").raw))
    text, thoughts = split(collect(loop, make("openai")))
    assert text == TEXT
    assert [(t.text, t.fresh) for t in thoughts] == [("hmm, ", True), ("hmm, ", False),
                                                     ("hmm, ", False)]


def test_reasoning_that_is_not_text_is_no_thinking(make, fake, loop):
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"reasoning_content": {"a": 1}},
                          "finish_reason": None}]}
    fake.push(Reply(raw=[(None, json.dumps(chunk))] + stream("openai").raw))
    text, thoughts = split(collect(loop, make("openai")))
    assert text == TEXT and thoughts == []


def test_thinking_and_text_in_one_chunk_are_both_read(make, fake, loop):
    events = openai_events(TEXT)
    events[0][1]["choices"][0]["delta"]["reasoning_content"] = "so: "
    fake.push(Reply(raw=[(e, json.dumps(d)) for e, d in events] + [(None, "[DONE]")]))
    text, thoughts = split(collect(loop, make("openai")))
    assert text == TEXT and [t.text for t in thoughts] == ["so: "]


@pytest.mark.parametrize("setting, sent", [
    (None, None), ("adaptive", {"type": "adaptive"}), ("disabled", {"type": "disabled"}),
    (2048, {"type": "enabled", "budget_tokens": 2048})])
def test_claudes_thinking_setting_is_sent_as_the_api_documents_it(setting, sent, make, fake,
                                                                  loop):
    settings = FAST.model_copy(update={"anthropic": AnthropicSettings(thinking=setting)})
    fake.push(Reply(raw=claude_thinking(["ok"])))
    collect(loop, make("anthropic", settings))
    assert fake.requests[-1].body.get("thinking") == sent


@pytest.mark.parametrize("value", [1023, 0, "on", "enabled", True])
def test_a_thinking_setting_the_api_would_refuse_is_a_configuration_error(value):
    with pytest.raises(ValidationError):
        LLMSettings.model_validate({"anthropic": {"thinking": value}})


def test_a_thinking_delta_that_is_not_text_is_a_clear_failure(make, fake, loop):
    raw = claude_thinking(["ok"])
    raw[2] = (raw[2][0], raw[2][1].replace('"thinking": "ok"', '"thinking": 5'))
    fake.push(*[Reply(raw=raw)] * (FAST.retries + 1))
    with pytest.raises(LLMError) as caught:
        collect(loop, make("anthropic"))
    assert caught.value.code == "LLM_UNAVAILABLE"


def test_a_thinking_budget_above_the_replys_cap_is_a_clear_error_before_any_request(make,
                                                                                   fake, loop):
    settings = FAST.model_copy(update={"max_tokens": 2048,
                                       "anthropic": AnthropicSettings(thinking=4096)})
    with pytest.raises(LLMError) as caught:
        collect(loop, make("anthropic", settings))
    assert "thinking = 4096" in caught.value.message and "2048" in caught.value.message
    assert fake.requests == []


# -- thinking written into the text, as <think>…</think> ------------------------------

from hypothesis import given, settings as hypothesis_settings, strategies as st  # noqa: E402

from opencortex.llm.think_tags import ThinkTags  # noqa: E402

PIECE = st.text(alphabet=st.sampled_from(list("<>/thinkTHINK \n(:x\"")), max_size=12)


def split_at(text: str, cuts: list[int]) -> list[str]:
    """TEXT cut at CUTS (positions, any order, any repeats)."""
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def fed(chunks: list[str]) -> tuple[str, str]:
    """The thinking and the text THINKTAGS makes of CHUNKS."""
    tags = ThinkTags()
    pieces = [p for chunk in chunks for p in tags.feed(chunk)] + tags.close()
    return ("".join(p.text for p in pieces if isinstance(p, Thinking)),
            "".join(p for p in pieces if isinstance(p, str)))


@hypothesis_settings(max_examples=300, deadline=None)
@given(space=st.sampled_from(["", " ", "\n", " \n\t"]), thought=PIECE, rest=PIECE,
       cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=8))
def test_a_reply_opening_with_a_think_block_splits_into_its_thinking_and_text(
        space, thought, rest, cuts):
    if "</think>" in thought:
        return
    assert fed(split_at(f"{space}<think>{thought}</think>{rest}", cuts)) == (thought, rest)


@hypothesis_settings(max_examples=300, deadline=None)
@given(text=PIECE, cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6))
def test_any_other_reply_is_text_as_written(text, cuts):
    if text.lstrip().startswith("<think>"):
        return
    assert fed(split_at(text, cuts)) == ("", text)


def test_white_space_that_never_decides_is_held_only_so_long():
    tags = ThinkTags()
    assert tags.feed(" " * 4000) == []
    assert tags.feed(" " * 200) == [" " * 4200]


def test_a_think_block_of_the_text_is_thinking_not_the_reply(make, fake, loop):
    """vLLM without a reasoning parser: the thinking opens the text."""
    reply = '<think>I could answer (:type :REQUEST :text "draft")</think>\n(:type :REQUEST)'
    fake.push(Reply(chunks=[reply[i:i + 5] for i in range(0, len(reply), 5)]))
    text, thoughts = split(collect(loop, make("openai")))
    assert text == "\n(:type :REQUEST)"
    assert "".join(t.text for t in thoughts) == 'I could answer (:type :REQUEST :text "draft")'
    assert thoughts[0].fresh and not any(t.fresh for t in thoughts[1:])
