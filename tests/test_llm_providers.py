"""Both provider backends, through their real SDKs, against loopback imitations of the APIs.

Every test runs for `anthropic` (the official SDK, Messages API SSE) and `openai`
(the official SDK, chat-completions SSE).  The fake server is in tests/llm_fakes.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from opencortex.llm import EchoFallback, LLMError, PromptRequest, ReplyAddress, Usage
from opencortex.llm.anthropic_api import AnthropicBackend
from opencortex.llm.cost import estimate_cost
from opencortex.llm.failures import ProviderUnreachable
from opencortex.llm.openai_compatible import OpenAICompatibleBackend
from opencortex.llm.settings import LLMSettings

from llm_fakes import FakeProvider, Reply

SECRET = "sk-test-SECRET-0123456789abcdef"
PRIVATE = "PRIVATE-MESSAGE-TEXT"
KINDS = ["anthropic", "openai"]
FAST = LLMSettings(retry_base_delay=0.001, stall_timeout=0.3, first_chunk_timeout=1.5,
                   connect_timeout=2.0)


def request(text: str = PRIVATE, channel: str = "cli", **routing: str) -> PromptRequest:
    return PromptRequest(system="SYSTEM PROMPT", messages=[{"role": "user", "content": text}],
                         reply_to=ReplyAddress(channel=channel, chat_id="c1", buffer="b"),
                         routing=routing)


@pytest.fixture(scope="module")
def fake():
    with FakeProvider() as server:
        yield server


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(autouse=True)
def fresh_queue(fake):
    fake.queue.clear()
    fake.requests.clear()
    yield
    fake.queue.clear()


@pytest.fixture
def make(fake, loop):
    """make(kind, settings=FAST, key=SECRET, url=None) → a backend, closed after the test."""
    made = []

    def build(kind: str, settings: LLMSettings = FAST, key: str | None = SECRET,
              url: str | None = None):
        if kind == "anthropic":
            backend = AnthropicBackend(settings, api_key=key or "", base_url=url or fake.url)
        else:
            backend = OpenAICompatibleBackend(settings, api_key=key or "",
                                              base_url=url or fake.openai_url)
        backend.waits = []

        async def record(seconds: float) -> None:
            backend.waits.append(seconds)
        backend.sleep = record
        made.append(backend)
        return backend

    yield build
    for backend in made:
        loop.run_until_complete(backend.aclose())


def collect(loop, backend, req: PromptRequest | None = None) -> list:
    async def run():
        return [item async for item in backend.stream(req or request())]
    return loop.run_until_complete(asyncio.wait_for(run(), 30))


def failure(loop, backend, req: PromptRequest | None = None) -> LLMError:
    with pytest.raises(LLMError) as caught:
        collect(loop, backend, req)
    return caught.value


# -- the backend law ----------------------------------------------------------

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@pytest.mark.parametrize("kind", KINDS)
@hypothesis_settings(max_examples=25, deadline=None)
@given(chunks=st.lists(TEXT, min_size=1, max_size=12))
def test_the_chunks_add_up_to_the_reply_then_one_usage(kind, chunks, fake, loop):
    backend = (AnthropicBackend(FAST, api_key=SECRET, base_url=fake.url) if kind == "anthropic"
               else OpenAICompatibleBackend(FAST, api_key=SECRET, base_url=fake.openai_url))
    fake.push(Reply(chunks=chunks))
    try:
        items = collect(loop, backend)
    finally:
        loop.run_until_complete(backend.aclose())
    texts = [item for item in items if isinstance(item, str)]
    assert "".join(texts) == "".join(chunks)
    assert all(texts) and [item for item in items if isinstance(item, Usage)] == [items[-1]]
    assert not items[-1].estimated


# -- usage, cost, request shape ----------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_usage_and_cost_come_from_the_provider(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(input_tokens=1000, output_tokens=200, cache_read=300, cache_write=50))
    usage = collect(loop, backend)[-1]
    assert usage.output_tokens == 200 and usage.stop_reason == "end_turn"
    if kind == "anthropic":  # uncached + read + written
        assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == \
            (1350, 300, 50)
        assert usage.model == "claude-opus-4-7"  # cli → developer → the large model
    else:  # prompt_tokens already counts the cached ones
        assert (usage.input_tokens, usage.cache_read_tokens) == (1000, 300)
        assert usage.model == "gpt-4o-mini"
    assert usage.cost_usd == estimate_cost(usage, FAST.prices) and usage.cost_usd > 0
    assert usage.first_chunk_s is not None and usage.latency_s >= usage.first_chunk_s


@pytest.mark.parametrize("kind", KINDS)
def test_who_asks_decides_model_and_cap(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(), Reply())
    collect(loop, backend, request(channel="telegram"))  # a guest on a bridge
    collect(loop, backend, request(channel="telegram", archetype="developer", skill="chat"))
    guest, owner = (seen.body for seen in fake.requests)
    assert guest["max_tokens"] == 1024 and owner["max_tokens"] == 4096
    if kind == "anthropic":
        assert (guest["model"], owner["model"]) == ("claude-haiku-4-5", "claude-opus-4-7")


# -- rate limits and retries --------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_retries_honour_retry_after_then_back_off(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "7"}),
              Reply(status=529, error_type="overloaded_error"),
              Reply(chunks=["fine"]))
    items = collect(loop, backend)
    assert items[0] == "fine" and len(fake.requests) == 3
    assert backend.waits[0] == 7.0
    assert 0.001 <= backend.waits[1] <= 0.002  # retry_base_delay × 2, with jitter


@pytest.mark.parametrize("kind", KINDS)
def test_rate_limited_after_the_retries_carries_the_wait(kind, make, fake, loop):
    backend = make(kind)
    fake.push(*[Reply(status=429, error_type="rate_limit_error",
                      headers={"retry-after": "2"})] * 3)
    error = failure(loop, backend)
    assert error.code == "RATE_LIMITED" and error.retry_after_seconds == 2.0
    assert "gave up after 3 attempts: try again in 2 s" in error.message
    assert len(fake.requests) == 3 and backend.waits == [2.0, 2.0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_wait_longer_than_retry_max_wait_is_not_waited_for(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "120"}))
    error = failure(loop, backend)
    assert error.code == "RATE_LIMITED" and error.retry_after_seconds == 120
    assert len(fake.requests) == 1 and backend.waits == []


@pytest.mark.parametrize("kind, code", [("anthropic", "enforced_spend_limit_reached"),
                                        ("openai", "insufficient_quota")])
def test_a_spend_limit_is_not_retried(kind, code, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(status=429, error_type="rate_limit_error", error_code=code))
    error = failure(loop, backend)
    assert error.code == "RATE_LIMITED" and "spend limit" in error.message
    assert len(fake.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_event_before_any_text_is_retried(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(error_after=0, error_type="overloaded_error"), Reply(chunks=["ok"]))
    assert collect(loop, backend)[0] == "ok" and len(fake.requests) == 2


# -- timeouts and broken streams ---------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_after_text_is_a_stream_timeout(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(chunks=["partial", "never"], stall_after=1))
    seen: list[str] = []

    async def run():
        async for item in backend.stream(request()):
            seen.append(item)
    with pytest.raises(LLMError) as caught:
        loop.run_until_complete(asyncio.wait_for(run(), 30))
    assert seen == ["partial"]
    assert caught.value.code == "STREAM_TIMEOUT"
    assert "cut off after 1 chunk" in caught.value.message
    assert "stall_timeout" in caught.value.message and "send the message again" in \
        caught.value.message


@pytest.mark.parametrize("kind", KINDS)
def test_no_first_chunk_in_time_is_a_stream_timeout_not_retried(kind, make, fake, loop):
    backend = make(kind, FAST.model_copy(update={"first_chunk_timeout": 0.3}))
    fake.push(Reply(stall_after=0))
    error = failure(loop, backend)
    assert error.code == "STREAM_TIMEOUT" and "first_chunk_timeout" in error.message
    assert len(fake.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reply, code, says", [
    (Reply(chunks=["a", "b", "c"], break_after=2), "LLM_UNAVAILABLE", "connection"),
    (Reply(chunks=["a", "b"], error_after=1, error_type="overloaded_error"), "RATE_LIMITED",
     "overloaded"),
    (Reply(chunks=["a", "b"], error_after=1, error_type="api_error"), "LLM_UNAVAILABLE",
     "failed on its side"),
    (Reply(chunks=["a", "b"], no_stop=True), "LLM_UNAVAILABLE", "ended the stream early"),
])
def test_a_stream_cut_midway_fails_the_turn_and_is_not_replaced(kind, reply, code, says, make,
                                                                fake, loop):
    fake.push(reply)
    backend = EchoFallback(make(kind))
    error = failure(loop, backend)
    assert not isinstance(error, ProviderUnreachable)
    assert error.code == code and says in error.message
    assert "cut off" in error.message and "nothing of it was saved" in error.message
    assert len(fake.requests) == 1


# -- keys, refusals, unreachable providers -----------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_key_names_the_variable_and_never_the_key(kind, make, fake, loop, caplog):
    caplog.set_level(logging.DEBUG)
    backend = make(kind)
    fake.push(Reply(status=401, error_type="authentication_error"))
    error = failure(loop, backend)
    variable = "ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY"
    assert error.code == "LLM_UNAVAILABLE" and f"set {variable} to a valid key" in error.message
    assert SECRET not in error.message and SECRET not in caplog.text
    assert PRIVATE not in caplog.text
    auth = fake.requests[0].headers.get("Authorization", "") + \
        fake.requests[0].headers.get("X-Api-Key", "")
    assert SECRET in auth  # the key went to the provider, and only there


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_refused_after_it_worked_is_an_expired_session(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(), Reply(status=401, error_type="authentication_error"))
    collect(loop, backend)
    error = failure(loop, backend)
    assert error.code == "SESSION_EXPIRED" and "worked earlier" in error.message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status, kind_of_error, code, says", [
    (400, "invalid_request_error", "INVALID_MESSAGE", "refused the request"),
    (413, "request_too_large", "INVALID_MESSAGE", "413"),
    (403, "permission_error", "LLM_UNAVAILABLE", "may not use"),
    (404, "not_found_error", "LLM_UNAVAILABLE", "--model"),
])
def test_refusals_map_to_their_codes_without_retry(kind, status, kind_of_error, code, says, make,
                                                    fake, loop):
    backend = make(kind)
    fake.push(Reply(status=status, error_type=kind_of_error))
    error = failure(loop, backend)
    assert error.code == code and says in error.message and len(fake.requests) == 1


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("kind", KINDS)
def test_an_unreachable_provider_falls_back_to_echo_saying_so(kind, make, loop, caplog):
    caplog.set_level(logging.DEBUG)
    url = closed_port_url()
    backend = EchoFallback(make(kind, url=url if kind == "anthropic" else url + "/v1"))
    items = collect(loop, backend, request("hello"))
    text = "".join(i for i in items if isinstance(i, str))
    usage = items[-1]
    assert f"[Echo] ({kind} unavailable: cannot reach {kind}" in text and text.count("hello") == 1
    assert usage.model == "echo" and f"cannot reach {kind}" in usage.fallback_reason
    assert "echo answered" in caplog.text and "hello" not in caplog.text
    again = collect(loop, backend, request("again"))  # says so every time
    assert "unavailable" in "".join(i for i in again if isinstance(i, str))


@pytest.mark.parametrize("kind", KINDS)
def test_unreachable_without_fallback_is_llm_unavailable(kind, make, loop):
    url = closed_port_url()
    error = failure(loop, make(kind, url=url if kind == "anthropic" else url + "/v1"))
    assert error.code == "LLM_UNAVAILABLE" and "cannot reach" in error.message


@pytest.mark.parametrize("kind", KINDS)
def test_server_errors_are_retried_then_echo_stands_in(kind, make, fake, loop):
    fake.push(*[Reply(status=503, error_type="api_error")] * 3)
    items = collect(loop, EchoFallback(make(kind)))
    assert items[-1].model == "echo" and "503" in items[-1].fallback_reason
    assert len(fake.requests) == 3


def test_a_missing_key_is_unreachable_and_named(make, loop):
    backend = make("anthropic", key="")
    error = failure(loop, backend)
    assert isinstance(error, ProviderUnreachable)
    assert "ANTHROPIC_API_KEY is not set" in error.message
    official = make("openai", key="", url="https://api.openai.com/v1")
    assert "OPENAI_API_KEY is not set" in failure(loop, official).message


# -- the stall watchdog -------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_consumer_is_not_a_stall(kind, make, fake, loop):
    backend = make(kind, FAST.model_copy(update={"stall_timeout": 0.1}))
    fake.push(Reply(chunks=["a", "b", "c"]))

    async def slow():
        seen = []
        async for item in backend.stream(request()):
            seen.append(item)
            await asyncio.sleep(0.25)  # longer than stall_timeout, but not the provider's fault
        return seen
    seen = loop.run_until_complete(asyncio.wait_for(slow(), 30))
    assert seen[:3] == ["a", "b", "c"] and isinstance(seen[-1], Usage)


@pytest.mark.parametrize("kind", KINDS)
def test_cancelling_the_turn_is_not_mistaken_for_a_stall(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(chunks=["a", "b"], stall_after=1))

    async def abort():
        first = asyncio.Event()

        async def read():
            async for _ in backend.stream(request()):
                first.set()
        task = asyncio.create_task(read())
        await asyncio.wait_for(first.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    loop.run_until_complete(asyncio.wait_for(abort(), 30))


@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_leaves_an_outer_timeout_working(kind, make, fake, loop):
    backend = make(kind)
    fake.push(Reply(chunks=["a"], stall_after=1), Reply(chunks=["b"], stall_after=1))

    async def twice():
        async with asyncio.timeout(20):
            for _ in range(2):
                with pytest.raises(LLMError, match="stall_timeout"):
                    async for _ in backend.stream(request()):
                        pass
        assert asyncio.current_task().cancelling() == 0
        with pytest.raises(TimeoutError):  # the outer deadline still fires on its own
            async with asyncio.timeout(0.05):
                await asyncio.sleep(1)
    loop.run_until_complete(twice())
