"""A provider that breaks its protocol, through the real SDKs: the turn fails with a clear
error and never with another exception; a count no reply could have is estimated.  And
what servers add outside it: a reasoning model's thinking keeps a stream alive.

The SDKs build a stream's objects without checking them, so a field a server (a
local model server, a proxy, a gateway) writes as other JSON than the API's
reached the kernel as that type: a number where text belongs raised a TypeError
out of the turn, a dict was taken for the usage, a negative count credited the
budget.  The fake serves each stream here as raw SSE events.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from opencortex.llm import LLMError, Usage
from opencortex.llm.anthropic_api import AnthropicBackend
from opencortex.llm.openai_compatible import OpenAICompatibleBackend
from opencortex.llm.failures import MAX_RETRY_AFTER
from opencortex.llm.reported import MAX_NAME, MAX_REPORTED_TOKENS

from llm_fakes import Reply
from test_llm_providers import (FAST, KINDS, PRIVATE, SECRET, collect, fake, fresh_queue,  # noqa: F401
                                loop, make, request)

TEXT = "Hello there"


def openai_events(text: str = TEXT) -> list[tuple[str | None, object]]:
    """A whole chat-completions stream, as the API documents it."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-4o-mini"}
    return [
        (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                     "finish_reason": None}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, {**base, "choices": [], "usage": {
            "prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
            "prompt_tokens_details": {"cached_tokens": 0}}}),
    ]


def anthropic_events(text: str = TEXT) -> list[tuple[str | None, object]]:
    """A whole Messages stream, as the API documents it."""
    return [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-opus-4-7",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 7}}),
        ("message_stop", {"type": "message_stop"}),
    ]


EVENTS = {"openai": openai_events, "anthropic": anthropic_events}

# Where a field can be replaced: (event number, keys into its data; () is the data itself).
PLACES = {
    "openai": [(0, ()), (0, ("choices",)), (0, ("choices", 0)), (0, ("choices", 0, "delta")),
               (0, ("choices", 0, "delta", "content")), (1, ("choices", 0, "finish_reason")),
               (0, ("model",)), (2, ("usage",)), (2, ("usage", "prompt_tokens")),
               (2, ("usage", "completion_tokens")), (2, ("usage", "prompt_tokens_details")),
               (2, ("usage", "prompt_tokens_details", "cached_tokens"))],
    "anthropic": [(0, ()), (0, ("message",)), (0, ("message", "model")),
                  (0, ("message", "usage")), (0, ("message", "usage", "input_tokens")),
                  (1, ("content_block",)), (2, ("index",)), (2, ("delta",)),
                  (2, ("delta", "text")), (4, ("delta", "stop_reason")), (4, ("usage",)),
                  (4, ("usage", "output_tokens"))],
}


def stream(kind: str, place: tuple[int, tuple] | None = None, value: object = None,
           text: str = TEXT) -> Reply:
    """KIND's whole stream of TEXT, with the field at PLACE written as VALUE."""
    events = copy.deepcopy(EVENTS[kind](text))
    if place is not None:
        number, keys = place
        if not keys:
            events[number] = (events[number][0], value)
        else:
            data = events[number][1]
            for key in keys[:-1]:
                data = data[key]
            data[keys[-1]] = value
    raw = [(event, json.dumps(data)) for event, data in events]
    return Reply(raw=raw + ([(None, "[DONE]")] if kind == "openai" else []))


def usage_of(items: list) -> Usage:
    assert [item for item in items if isinstance(item, Usage)] == [items[-1]]
    return items[-1]


@pytest.mark.parametrize("kind", KINDS)
def test_the_documented_stream_reads_as_its_text_and_counts(kind, make, fake, loop):
    fake.push(stream(kind))
    items = collect(loop, make(kind))
    assert "".join(items[:-1]) == TEXT
    usage = usage_of(items)
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (11, 7, False)


@pytest.mark.parametrize("kind, place, value, says", [   # before any text
    ("openai", (0, ("choices", 0, "delta", "content")), 5, "delta.content is not text"),
    ("openai", (0, ("choices", 0, "delta", "content")), {"x": PRIVATE},
     "delta.content is not text"),
    ("openai", (0, ("choices",)), PRIVATE, "choices are not a list of objects"),
    ("openai", (0, ("choices", 0)), 5, "choices are not a list of objects"),
    ("openai", (0, ("choices", 0, "delta")), PRIVATE, "delta is not a JSON object"),
    ("openai", (0, ("choices", 0, "finish_reason")), [PRIVATE], "finish_reason is not a name"),
    ("openai", (0, ("usage",)), PRIVATE, "usage is not a JSON object"),
    ("openai", (0, ()), PRIVATE, "a chunk is not a JSON object"),
    ("openai", (0, ()), None, "a chunk is not a JSON object"),
    ("anthropic", (2, ("delta", "text")), 5, "unexpected TypeError"),
    ("anthropic", (2, ("delta", "text")), {"x": PRIVATE}, "unexpected TypeError"),
    ("anthropic", (2, ("delta",)), PRIVATE, "unexpected AttributeError"),
    ("anthropic", (0, ("message",)), PRIVATE, "unexpected AttributeError"),
])
def test_a_reply_that_breaks_the_protocol_fails_clearly_and_is_not_retried(
        kind, place, value, says, make, fake, loop, caplog):
    caplog.set_level(logging.DEBUG)
    fake.push(*[stream(kind, place, value)] * 3)   # were it retried, the same again
    with pytest.raises(LLMError) as caught:
        collect(loop, make(kind))
    error = caught.value
    assert error.code == "LLM_UNAVAILABLE"
    assert f"{kind} sent a reply that cannot be read" in error.message and says in error.message
    assert PRIVATE not in error.message and PRIVATE not in caplog.text
    assert len(fake.requests) == 1     # each attempt is paid for, and would fail alike


@pytest.mark.parametrize("kind", KINDS)
def test_text_then_a_chunk_that_cannot_be_read_is_a_cut_reply_not_retried(kind, make, fake,
                                                                          loop):
    events = EVENTS[kind]()
    odd = ({"choices": [{"index": 0, "delta": {"content": 5}, "finish_reason": None}]}
           if kind == "openai" else
           {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
                                                                 "text": 5}})
    at = 1 if kind == "openai" else 3
    events.insert(at, (events[at - 1][0], odd))
    fake.push(Reply(raw=[(event, json.dumps(data)) for event, data in events]))
    seen: list = []

    async def run():
        async for item in make(kind).stream(request()):
            seen.append(item)
    with pytest.raises(LLMError) as caught:
        loop.run_until_complete(run())
    assert seen == [TEXT] and len(fake.requests) == 1
    assert "cut off after 1 chunk" in caught.value.message
    assert "cannot be read" in caught.value.message


@pytest.mark.parametrize("kind, place, value, says", [
    ("openai", (1, ("choices", 0, "finish_reason")), {"x": PRIVATE},
     "finish_reason is not a name"),
    ("anthropic", (4, ("delta", "stop_reason")), 5, "stop_reason is not a name"),
])
def test_a_reason_to_stop_that_is_not_one_leaves_the_reply_unfinished(kind, place, value, says,
                                                                      make, fake, loop):
    fake.push(stream(kind, place, value))
    with pytest.raises(LLMError) as caught:
        collect(loop, make(kind))
    assert "cut off after 1 chunk" in caught.value.message and says in caught.value.message
    assert PRIVATE not in caught.value.message and len(fake.requests) == 1


COUNTS = [-5, 10**30, MAX_REPORTED_TOKENS + 1, "twelve", 1.5, None, [3], {"n": 3}]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", COUNTS, ids=repr)
def test_a_count_no_reply_could_have_is_estimated_not_charged(kind, count, make, fake, loop):
    place = ((2, ("usage", "completion_tokens")) if kind == "openai"
             else (4, ("usage", "output_tokens")))
    fake.push(stream(kind, place, count))
    items = collect(loop, make(kind))
    assert "".join(items[:-1]) == TEXT
    usage = usage_of(items)
    assert usage.estimated and usage.output_tokens == 3    # "Hello there": 11 characters
    assert 0 < usage.input_tokens < 100 and usage.cost_usd is not None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("model", [5, {"name": PRIVATE}, "", "m" * (MAX_NAME + 1),
                                   "gpt\x1b[2J", "gpt\nINFO forged"], ids=repr)
def test_a_model_name_that_is_not_one_is_the_model_asked_for(kind, model, make, fake, loop):
    place = (0, ("model",)) if kind == "openai" else (0, ("message", "model"))
    fake.push(stream(kind, place, model))
    with warnings.catch_warnings(record=True) as seen:   # the filters in force, recorded
        usage = usage_of(collect(loop, make(kind)))
    assert usage.model == fake.requests[0].body["model"] and not usage.estimated
    assert not [w for w in seen if PRIVATE in str(w.message)]   # pydantic quoted it on stderr


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("asked", ["soon", "inf", "1e400", "Mon, 99 Foo 2020 99:99:99 GMT"])
def test_a_wait_that_is_no_time_is_backed_off_as_if_none_was_asked(kind, asked, make, fake,
                                                                   loop):
    """Before, a word or a malformed date raised ValueError out of the turn, and an
    infinite wait OverflowError."""
    backend = make(kind)
    fake.push(*[Reply(status=429, error_type="rate_limit_error",
                      headers={"retry-after": asked})] * 3)
    with pytest.raises(LLMError) as caught:
        collect(loop, backend)
    error = caught.value
    assert error.code == "RATE_LIMITED" and "gave up after 3 attempts: try again in" in \
        error.message
    assert len(backend.waits) == 2 and all(0 < wait < 1 for wait in backend.waits)
    assert 0 < error.retry_after_seconds < 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_wait_of_centuries_is_reported_as_a_week_and_not_waited(kind, make, fake, loop):
    fake.push(Reply(status=429, error_type="rate_limit_error",
                    headers={"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}))
    with pytest.raises(LLMError) as caught:
        collect(loop, make(kind))
    assert caught.value.retry_after_seconds == MAX_RETRY_AFTER and len(fake.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_the_providers_own_words_are_quoted_as_one_short_visible_line(kind, make, fake, loop):
    words = "\x1b]0;owned\x07bad request\n* A heading\r" + "x" * 100_000
    fake.push(Reply(status=400, error_type="invalid_request_error" + "\n\x1b[2J" * 1000,
                    error_message=words))
    with pytest.raises(LLMError) as caught:
        collect(loop, make(kind))
    message = caught.value.message
    assert caught.value.code == "INVALID_MESSAGE" and "bad request" in message
    assert len(message) < 500 and "\x1b" not in message and "\n" not in message
    assert "\r" not in message and "\x07" not in message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("label", ["text/html; charset=utf-8", "application/json"])
def test_an_answer_that_is_no_event_stream_is_named_so(kind, label, make, fake, loop):
    """A login page, a proxy's answer, a server ignoring `stream`: before, "ended the
    stream early", which named neither the cause nor what to check."""
    fake.push(Reply(raw=[], headers={"content-type": label}))
    with pytest.raises(LLMError) as caught:
        collect(loop, make(kind))
    assert caught.value.code == "LLM_UNAVAILABLE"
    assert f"it answered {label.split(';')[0]}, not an event stream" in caught.value.message
    assert "base_url" in caught.value.message and len(fake.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_an_event_stream_labelled_otherwise_still_reads(kind, make, fake, loop):
    whole = stream(kind)
    fake.push(Reply(raw=whole.raw, headers={"content-type": "text/plain"}))
    assert "".join(collect(loop, make(kind))[:-1]) == TEXT


def thinking(field: str, count: int) -> list[tuple[str | None, str]]:
    """COUNT chat-completions chunks of a reasoning model's thinking, in FIELD."""
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
             "model": "qwen3", "choices": [{"index": 0, "delta": {field: "hmm, "},
                                            "finish_reason": None}]}
    return [(None, json.dumps(chunk))] * count


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_reasoning_models_thinking_keeps_its_stream_alive(field, make, fake, loop):
    """1.2 s of thinking before any text, against a first_chunk_timeout of 0.5 s: before,
    a STREAM_TIMEOUT (llama.cpp, vLLM and DeepSeek write `reasoning_content`; Ollama
    and OpenRouter `reasoning`)."""
    quick = FAST.model_copy(update={"first_chunk_timeout": 0.5, "stall_timeout": 1.0})
    fake.push(Reply(raw=thinking(field, 12) + stream("openai").raw, delay=0.1))
    items = collect(loop, make("openai", quick))
    text = [item for item in items[:-1] if isinstance(item, str)]
    assert "".join(text) == TEXT and "hmm" not in "".join(text)


def test_thinking_that_pauses_longer_than_stall_timeout_is_a_stall(make, fake, loop):
    quick = FAST.model_copy(update={"first_chunk_timeout": 5.0, "stall_timeout": 0.5})
    fake.push(Reply(raw=thinking("reasoning_content", 2) + stream("openai").raw, delay=1.5))
    with pytest.raises(LLMError) as caught:
        collect(loop, make("openai", quick))
    assert caught.value.code == "STREAM_TIMEOUT"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6)


@pytest.mark.parametrize("kind", KINDS)
@hypothesis_settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_json_in_any_field_is_a_reply_or_a_clear_failure(kind, data, fake, loop):
    place = data.draw(st.sampled_from(PLACES[kind]))
    value = data.draw(JSON)
    fake.queue.clear()
    fake.push(*[stream(kind, place, value)] * (FAST.retries + 1))
    backend = (AnthropicBackend(FAST, api_key=SECRET, base_url=fake.url) if kind == "anthropic"
               else OpenAICompatibleBackend(FAST, api_key=SECRET, base_url=fake.openai_url))

    async def no_wait(seconds: float) -> None:
        pass
    backend.sleep = no_wait
    try:
        items = collect(loop, backend)
    except LLMError as error:   # unreadable, or ended early: either is the stream's fault
        assert error.code == "LLM_UNAVAILABLE"
        return
    finally:
        loop.run_until_complete(backend.aclose())
    usage = usage_of(items)
    assert all(isinstance(item, str) for item in items[:-1])
    for count in (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
                  usage.cache_write_tokens):
        assert count.__class__ is int and 0 <= count <= 3 * MAX_REPORTED_TOKENS
    assert isinstance(usage.model, str) and 0 < len(usage.model) <= MAX_NAME
    assert isinstance(usage.stop_reason, str)
