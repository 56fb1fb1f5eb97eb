"""Real turns through the kernel with the real SDKs: what the person sees, what is archived."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import pytest

from opencortex.config import load_config
from opencortex.events import Thread, chat_message
from opencortex.kernel import TurnObserver
from opencortex.runtime import build_kernel

from conftest import cli_env
from llm_fakes import FakeProvider, Reply
from test_llm_malformed import stream

SECRET = "sk-ant-test-SECRET-9876543210"
PLIST = '(:type :REQUEST :target :cli :text "Hello from the model")'
CLI = Thread("cli", "local")


def pieces(text: str, size: int = 5) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.fixture
def fake():
    with FakeProvider() as server:
        yield server


@pytest.fixture
def anthropic_home(home, fake, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    (home / "config.toml").write_text("backend = \"anthropic\"\n[llm]\nstall_timeout = 0.5\n"
                                      "retry_base_delay = 0.001\n")
    return home


class Chunks(TurnObserver):
    def __init__(self):
        self.seen: list[str] = []
        self.thought: list[str] = []

    def on_chunk(self, text: str) -> None:
        self.seen.append(text)

    def on_thinking(self, text: str, fresh: bool) -> None:
        self.thought.append(text)


def turn(home, text: str = "hi", observer: Chunks | None = None, **overrides):
    """One turn in a fresh kernel, followed by OBSERVER (else a Chunks of its own);
    returns (result, printed, streamed chunks, archive)."""
    observer = observer or Chunks()

    async def go():
        printed: list[str] = []
        kernel = build_kernel(load_config(home, **overrides), writer=printed.append)
        try:
            result = await kernel.handle(chat_message(text), observer)
            return result, printed, observer.seen, kernel.archive.read_thread(CLI)
        finally:
            await kernel.aclose()
    return asyncio.run(asyncio.wait_for(go(), 60))


def test_a_claude_turn_streams_is_shown_archived_and_priced(anthropic_home, fake):
    fake.push(Reply(chunks=pieces(PLIST), input_tokens=2000, output_tokens=20))
    result, printed, streamed, records = turn(anthropic_home)
    assert result.status == "done", result.errors
    assert "".join(streamed) == PLIST and printed == ["Hello from the model"]
    assert [r.text for r in records] == ["hi", "Hello from the model"]
    assert records[1].extra.get("BACKEND") == "anthropic"
    data = result.as_json()
    assert data["usage"]["model"] == "claude-opus-4-7"
    assert data["usage"]["input_tokens"] == 2000 and data["usage"]["output_tokens"] == 20
    assert data["usage"]["cost_usd"] == pytest.approx((2000 * 5 + 20 * 25) / 1e6)
    assert not result.warnings


def test_a_stream_cut_midway_archives_nothing_and_says_resend(anthropic_home, fake):
    fake.push(Reply(chunks=pieces(PLIST), break_after=3))
    result, printed, streamed, records = turn(anthropic_home)
    assert result.status == "failed" and records == []
    assert "".join(streamed) == PLIST[:15]  # the person saw the start of it ...
    assert "LLM_UNAVAILABLE: the reply was cut off after 3 chunks" in result.errors[0]
    assert "send the message again" in printed[-1]  # ... and is told it was cut


def test_a_stream_cut_midway_is_charged_to_the_budget_as_estimated(anthropic_home, fake):
    """The provider is paid for what it streamed before the cut; no usage count comes,
    so the kernel charges its estimate (before, a cut stream was free)."""
    config = anthropic_home / "config.toml"
    config.write_text(config.read_text() + "[budget.developer]\nsession_tokens = 100000\n")
    fake.push(Reply(chunks=pieces(PLIST), break_after=3))

    async def go():
        kernel = build_kernel(load_config(anthropic_home), writer=lambda text: None)
        try:
            result = await kernel.handle(chat_message("hi"))
            return result, kernel.budgets.scopes(CLI)
        finally:
            await kernel.aclose()
    result, scopes = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.status == "failed" and result.usage is not None
    usage = result.usage
    assert usage.estimated and usage.model == "claude-opus-4-7"
    assert usage.output_tokens == (15 + 3) // 4 and usage.input_tokens > 0
    assert usage.cost_usd == pytest.approx(
        (usage.input_tokens * 5 + usage.output_tokens * 25) / 1e6)
    assert [scope.used.tokens for scope in scopes] == [usage.input_tokens + usage.output_tokens]


def test_a_reply_that_cannot_be_read_fails_the_turn_keeps_nothing_and_the_next_works(
        anthropic_home, fake):
    """A text delta that is a number, not text: before, a TypeError left the turn."""
    odd = stream("anthropic", (2, ("delta", "text")), 5)
    fake.push(odd)

    async def go():
        printed: list[str] = []
        kernel = build_kernel(load_config(anthropic_home), writer=printed.append)
        try:
            failed = await kernel.handle(chat_message("first"))
            kept = kernel.archive.read_thread(CLI)
            fake.push(Reply(chunks=pieces(PLIST)))
            answered = await kernel.handle(chat_message("second"))
            return failed, kept, answered, printed, kernel.archive.read_thread(CLI)
        finally:
            await kernel.aclose()
    failed, kept, answered, printed, records = asyncio.run(asyncio.wait_for(go(), 60))
    assert failed.status == "failed" and kept == []
    assert failed.errors[0].startswith("LLM_UNAVAILABLE: anthropic sent a reply that cannot "
                                       "be read (unexpected TypeError at ")
    assert "nothing of this turn was kept" in printed[0]
    assert answered.status == "done" and answered.text == "Hello from the model"
    assert [record.text for record in records][-1] == "Hello from the model"


def test_a_reply_past_max_reply_bytes_is_not_read_on_and_the_turn_fails(anthropic_home, fake):
    """A server that ignores max_tokens: before, 98 MB streamed for 65 s into the person's
    buffer and 390 MB of the kernel's memory before the reader refused it."""
    fake.push(Reply(chunks=["x" * 65536] * 400, burst=True))   # 26 MB
    result, printed, streamed, records = turn(anthropic_home)
    assert result.status == "failed" and records == []
    assert "reply grew past max_reply_bytes (1048576 bytes)" in result.errors[0]
    assert sum(map(len, streamed)) <= 1 << 20
    assert result.usage is not None and result.usage.estimated   # charged as a cut reply


@pytest.fixture(params=["anthropic", "openai"])
def either_home(request, home, fake, monkeypatch):
    """A home whose backend is the Anthropic API or an OpenAI-compatible server (the fake)."""
    if request.param == "anthropic":
        return request.getfixturevalue("anthropic_home")
    (home / "config.toml").write_text(f'backend = "openai"\n[llm.openai]\nbase_url = '
                                      f'"{fake.openai_url}"\nmodel = "llama3.2"\n')
    return home


def test_a_reply_cut_at_the_output_limit_is_said_so_to_the_model_and_the_person(
        either_home, fake):
    """Before, the person and the model were told only what the reader found (a string
    or a list left open), never that the output limit cut the reply."""
    cut = Reply(chunks=pieces(PLIST[:25]), stop_reason="max_tokens")
    fake.push(cut, cut)
    result, printed, _, records = turn(either_home)
    assert result.status == "rejected" and len(fake.requests) == 2
    limit = "the reply reached the model's output limit (max_tokens) before it ended"
    assert result.errors[0].startswith(limit) and limit in printed[-1]
    asked_again = fake.requests[1].body["messages"][-1]["content"]
    assert asked_again.startswith(f"Your reply was rejected: {limit}: it has to be shorter")


def test_a_refusal_is_said_so_and_not_asked_again(either_home, fake):
    fake.push(Reply(chunks=["I can't help with that."], stop_reason="refusal"))
    result, printed, _, records = turn(either_home)
    assert result.status == "rejected" and len(fake.requests) == 1   # not asked again
    assert result.errors[0] == ("the model declined to answer (its provider ended the reply "
                                "as a refusal)")
    assert "declined to answer" in printed[-1]


def test_rate_limited_turn_tells_the_wait(anthropic_home, fake):
    fake.push(*[Reply(status=429, error_type="rate_limit_error",
                      headers={"retry-after": "0.01"})] * 3)
    result, printed, _, records = turn(anthropic_home)
    assert result.status == "failed" and records == []
    assert result.errors[0].startswith("RATE_LIMITED:") and "try again in" in printed[-1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_provider_answers_with_echo_saying_so(anthropic_home, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{free_port()}")
    result, printed, _, records = turn(anthropic_home, "are you there?")
    assert result.status == "done", result.errors
    assert printed[0].startswith("[Echo] (anthropic unavailable: cannot reach anthropic")
    assert printed[0].endswith("this reply is an echo) are you there?")
    assert records[1].text == printed[0]  # archived as what it is: an echo
    assert result.usage.model == "echo" and result.usage.fallback_reason


def test_without_fallback_an_unreachable_provider_is_an_error(anthropic_home, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{free_port()}")
    with open(anthropic_home / "config.toml", "a") as config:
        config.write("fallback_to_echo = false\n")
    result, printed, _, records = turn(anthropic_home)
    assert result.status == "failed" and records == []
    assert "LLM_UNAVAILABLE: cannot reach anthropic" in printed[-1]


def oc(home, *args: str, **env: str):
    return subprocess.run([sys.executable, "-m", "opencortex", *args], capture_output=True,
                          text=True, timeout=120, env=cli_env(home, **env))


def test_cli_backend_and_model_overrides_reach_the_provider(home, fake):
    fake.push(Reply(chunks=pieces(PLIST), input_tokens=1000, output_tokens=10))
    run = oc(home, "chat", "-m", "hello", "--json", "--backend", "anthropic",
             "--model", "claude-sonnet-4-6", ANTHROPIC_API_KEY=SECRET,
             ANTHROPIC_BASE_URL=fake.url)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["text"] == "Hello from the model" and data["backend"] == "anthropic"
    assert data["usage"]["model"] == "claude-sonnet-4-6"
    assert data["usage"]["cost_usd"] == pytest.approx((1000 * 3 + 10 * 15) / 1e6)
    assert fake.requests[0].body["model"] == "claude-sonnet-4-6"
    assert SECRET not in run.stdout + run.stderr


def test_cli_openai_compatible_server_without_a_key(home, fake):
    (home / "config.toml").write_text(f'[llm.openai]\nbase_url = "{fake.openai_url}"\n'
                                      'model = "llama3.2"\n')
    fake.push(Reply(chunks=pieces(PLIST)))
    run = oc(home, "chat", "-m", "hello", "--json")  # auto: a configured server is used
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["backend"] == "openai" and data["usage"]["model"] == "llama3.2"
    assert data["usage"]["cost_usd"] is None  # no price for a local model: unknown, not 0


def test_cli_wrong_key_names_the_variable_never_the_key(home, fake):
    fake.push(Reply(status=401, error_type="authentication_error"))
    run = oc(home, "chat", "-m", "hello", "--backend", "anthropic",
             ANTHROPIC_API_KEY=SECRET, ANTHROPIC_BASE_URL=fake.url)
    assert run.returncode == 1
    assert "set ANTHROPIC_API_KEY to a valid key" in run.stdout + run.stderr
    assert SECRET not in run.stdout + run.stderr


def test_a_think_block_in_the_text_is_thinking_never_the_reply(home, fake):
    """A reasoning model served without a reasoning parser writes its thinking into the
    text; before, a plist it only considered there was read as its reply."""
    (home / "config.toml").write_text(f'backend = "openai"\n[llm.openai]\nbase_url = '
                                      f'"{fake.openai_url}"\nmodel = "qwen3"\n')
    thought = 'I could say (:type :REQUEST :target :cli :text "DRAFT"), or better'
    fake.push(Reply(chunks=pieces(f"<think>{thought}</think>\n{PLIST}")))
    watched = Chunks()
    result, printed, streamed, records = turn(home, observer=watched)
    assert result.status == "done", result.errors
    assert printed == ["Hello from the model"]
    assert "".join(watched.thought) == thought and "DRAFT" not in "".join(streamed)
    assert [r.text for r in records] == ["hi", "Hello from the model"]
