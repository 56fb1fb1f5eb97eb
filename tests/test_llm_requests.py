"""What each backend sends: prompt caching, parameters, keys, and the SDKs imported lazily."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from pydantic import ValidationError

from opencortex.llm import LLMError, PromptRequest, ReplyAddress
from opencortex.llm.base import prompt_request
from opencortex.llm.anthropic_api import AnthropicBackend
from opencortex.llm.openai_compatible import NO_KEY, OpenAICompatibleBackend
from opencortex.llm.settings import LLMSettings

from conftest import REPO
from llm_fakes import FakeProvider, Reply

HISTORY = PromptRequest(
    system="MANDATE AND PERSONA",
    messages=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"},
              {"role": "user", "content": "second"}],
    reply_to=ReplyAddress(channel="emacs", chat_id="main", buffer="*opencortex-chat*"))


@pytest.fixture
def fake():
    with FakeProvider() as server:
        yield server


def run(backend, request: PromptRequest = HISTORY) -> list:
    async def go():
        try:
            return [item async for item in backend.stream(request)]
        finally:
            await backend.aclose()
    return asyncio.run(asyncio.wait_for(go(), 30))


def test_anthropic_marks_the_stable_system_prompt_for_caching(fake):
    fake.push(Reply(cache_read=900))
    usage = run(AnthropicBackend(LLMSettings(temperature=0.3), api_key="k",
                                 base_url=fake.url))[-1]
    body = fake.requests[0].body
    assert body["system"] == [{"type": "text", "text": "MANDATE AND PERSONA",
                               "cache_control": {"type": "ephemeral"}}]
    assert [m["content"] for m in body["messages"]] == ["first", "reply", "second"]
    assert "cache_control" not in str(body["messages"])  # what changes per turn comes after
    assert "temperature" not in body and body["stream"] is True  # refused by the API now
    assert body["model"] == "claude-opus-4-7" and body["max_tokens"] == 4096  # emacs: owner
    assert fake.requests[0].headers.get("anthropic-version")
    assert usage.cache_read_tokens == 900


def test_anthropic_prompt_cache_can_be_switched_off(fake):
    settings = LLMSettings.model_validate({"anthropic": {"prompt_cache": False}})
    fake.push(Reply())
    run(AnthropicBackend(settings, api_key="k", base_url=fake.url))
    body = fake.requests[0].body
    assert body["system"] == "MANDATE AND PERSONA"


def test_anthropic_honours_anthropic_base_url(fake, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    fake.push(Reply(chunks=["via env"]))
    assert run(AnthropicBackend(LLMSettings()))[0] == "via env"
    assert "sk-from-env" in fake.requests[0].headers.get("Authorization", "")


def test_openai_sends_the_system_prompt_first_and_asks_for_usage(fake):
    fake.push(Reply(stop_reason="max_tokens"))
    settings = LLMSettings.model_validate({"openai": {"model": "llama3"}, "max_tokens": 77,
                                           "temperature": 0.2})
    usage = run(OpenAICompatibleBackend(settings, api_key=None, base_url=fake.openai_url))[-1]
    body = fake.requests[0].body
    assert body["messages"][0] == {"role": "system", "content": "MANDATE AND PERSONA"}
    assert [m["role"] for m in body["messages"][1:]] == ["user", "assistant", "user"]
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == "llama3" and body["max_tokens"] == 77 and body["temperature"] == 0.2
    assert usage.stop_reason == "max_tokens" and not usage.estimated
    assert fake.requests[0].headers["Authorization"] == f"Bearer {NO_KEY}"  # no key: local


def test_openai_without_stream_usage_estimates_tokens(fake):
    settings = LLMSettings.model_validate({"openai": {"stream_usage": False, "model": "m"}})
    fake.push(Reply(chunks=["a" * 40]))
    usage = run(OpenAICompatibleBackend(settings, api_key="k", base_url=fake.openai_url))[-1]
    assert "stream_options" not in fake.requests[0].body
    assert usage.estimated and usage.output_tokens == 10 and usage.input_tokens > 0


def test_a_server_refusing_stream_options_is_asked_again_without_them(fake, caplog):
    """Older Azure API versions and some gateways answer 400 to `stream_options`: before,
    every turn failed with INVALID_MESSAGE until stream_usage was found and turned off."""
    settings = LLMSettings.model_validate({"openai": {"model": "m"}})
    backend = OpenAICompatibleBackend(settings, api_key="k", base_url=fake.openai_url)
    fake.push(Reply(chunks=["a" * 40], no_stream_options=True),
              Reply(chunks=["b" * 40], no_stream_options=True))
    first, second = run(backend), run(backend)
    assert [seen.body.get("stream_options") for seen in fake.requests] == \
        [{"include_usage": True}, None, None]      # refused once, then never sent again
    assert first[0] == "a" * 40 and second[0] == "b" * 40
    assert first[-1].estimated and first[-1].output_tokens == 10
    assert "refuses stream_options" in caplog.text


def test_a_server_refusing_the_caps_name_is_asked_again_with_the_other(fake, caplog):
    """OpenAI's reasoning models (o3, gpt-5) refuse `max_tokens`, as Azure serving them
    does: before, every turn with such a model failed with INVALID_MESSAGE."""
    settings = LLMSettings.model_validate({"openai": {"model": "o3"}, "max_tokens": 900})
    backend = OpenAICompatibleBackend(settings, api_key="k", base_url=fake.openai_url)
    fake.push(Reply(chunks=["a"], refuses=("max_tokens",)),
              Reply(chunks=["b"], refuses=("max_tokens",)))
    first, second = run(backend), run(backend)
    assert [(seen.body.get("max_tokens"), seen.body.get("max_completion_tokens"))
            for seen in fake.requests] == [(900, None), (None, 900), (None, 900)]
    assert first[0] == "a" and second[0] == "b"
    assert "refuses the cap's name" in caplog.text


def test_what_a_model_refused_is_left_out_for_that_model_only(fake):
    settings = LLMSettings.model_validate({
        "openai": {"model": "o3"}, "temperature": 0.2,
        "models": [{"archetype": "guest", "backend": "openai", "model": "gpt-4o"}]})
    backend = OpenAICompatibleBackend(settings, api_key="k", base_url=fake.openai_url)
    fake.push(Reply(refuses=("temperature", "max_tokens")), Reply())
    run(backend)
    guest = HISTORY.model_copy(update={"routing": {"archetype": "guest"}})
    run(backend, guest)
    last = fake.requests[-1].body
    assert last["model"] == "gpt-4o" and last["temperature"] == 0.2 and "max_tokens" in last


def test_a_model_refusing_a_temperature_is_asked_again_without_one(fake, caplog):
    """A reasoning model takes only its default temperature: before, a configured
    `temperature` failed every turn with it."""
    settings = LLMSettings.model_validate({"openai": {"model": "o3"}, "temperature": 0.2})
    backend = OpenAICompatibleBackend(settings, api_key="k", base_url=fake.openai_url)
    fake.push(Reply(chunks=["a"], refuses=("temperature", "max_tokens")),
              Reply(chunks=["b"], refuses=("temperature",)))
    first, second = run(backend), run(backend)
    assert [("temperature" in seen.body, "max_tokens" in seen.body)
            for seen in fake.requests] == [(True, True), (False, True), (False, False),
                                           (False, False)]
    assert first[0] == "a" and second[0] == "b"
    assert "refuses a temperature" in caplog.text


def test_the_official_api_gets_the_cap_as_max_completion_tokens():
    settings = LLMSettings.model_validate({"openai": {"model": "gpt-5"}, "max_tokens": 900})
    backend = OpenAICompatibleBackend(settings, api_key="k")
    params = backend.request_params(HISTORY, backend.choice_for(HISTORY))
    assert params["max_completion_tokens"] == 900 and "max_tokens" not in params


def test_a_server_refusing_both_names_is_not_asked_a_third_time(fake):
    settings = LLMSettings.model_validate({"openai": {"model": "m"}, "max_tokens": 900})
    backend = OpenAICompatibleBackend(settings, api_key="k", base_url=fake.openai_url)
    fake.push(Reply(refuses=("max_tokens", "max_completion_tokens")))
    with pytest.raises(LLMError) as caught:
        run(backend)
    assert caught.value.code == "INVALID_MESSAGE" and len(fake.requests) == 2


def test_another_refusal_of_the_request_is_not_asked_again(fake):
    fake.push(Reply(status=400, error_type="invalid_request_error"))
    backend = OpenAICompatibleBackend(LLMSettings(), api_key="k", base_url=fake.openai_url)
    with pytest.raises(LLMError) as caught:
        run(backend)
    assert caught.value.code == "INVALID_MESSAGE" and len(fake.requests) == 1


def test_the_sdks_are_imported_on_the_first_reply_not_at_start(home):
    code = ("import sys, os\n"
            "os.environ['ANTHROPIC_API_KEY'] = 'k'\n"
            "from opencortex.config import load_config\n"
            "from opencortex.runtime import build_kernel\n"
            f"kernel = build_kernel(load_config({str(home)!r}, backend='anthropic'))\n"
            "print(kernel.backend.name, 'anthropic' in sys.modules, 'openai' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["anthropic", "False", "False"]


@pytest.mark.parametrize("built", [
    {"system": "S", "messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "x" * 5000}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "no"}]},
    {"messages": [{"role": "user", "content": "hi", "name": "extra"}]},
    {"messages": [{"role": "user", "content": 3}]},
    {"messages": []},
    {"messages": "not a list"},
])
def test_a_skills_prompt_is_validated_as_the_model_would_validate_it(built):
    """`prompt_request` remembers short messages that validate; what it accepts, and how
    it refuses the rest, is what PromptRequest's own validation does."""
    try:
        expected = PromptRequest.model_validate(dict(built))
    except ValidationError as error:
        with pytest.raises(ValidationError) as raised:
            prompt_request(built)
        assert raised.value.errors() == error.errors()
    else:
        assert prompt_request(built) == expected


def test_a_message_sent_again_is_validated_once():
    built = {"messages": [{"role": "user", "content": "the same words"}]}
    assert prompt_request(built).messages[0] is prompt_request(built).messages[0]
