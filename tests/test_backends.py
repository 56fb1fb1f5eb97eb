"""The backend law: the chunks add up to the reply; then exactly one Usage."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings, strategies as st

from opencortex.llm import EchoBackend, LLMError, PromptRequest, ReplyAddress, ScriptBackend, Usage
from opencortex.llm.echo import echo_text
from opencortex.reader import read_plist


def request(text: str, channel: str = "cli") -> PromptRequest:
    return PromptRequest(system="s", messages=[{"role": "user", "content": text}],
                         reply_to=ReplyAddress(channel=channel, chat_id="c",
                                               buffer="*opencortex-chat*"))


async def collect(backend, req):
    items = [item async for item in backend.stream(req)]
    return [i for i in items if isinstance(i, str)], items[-1]


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1), st.integers(min_value=1, max_value=50),
       st.sampled_from(["cli", "emacs", "telegram", "signal", "matrix"]))
def test_echo_chunks_concatenate_to_the_reply(text, size, channel):
    chunks, usage = asyncio.run(collect(EchoBackend(chunk_size=size), request(text, channel)))
    assert "".join(chunks) == echo_text(request(text, channel))
    assert isinstance(usage, Usage) and usage.estimated and usage.output_tokens > 0
    assert read_plist("".join(chunks))["text"].endswith(text)


def test_script_replays_in_order_and_says_when_it_runs_out(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text('(:type :RESPONSE :text "one")\n%%\n(:type :RESPONSE :text "two")\n')
    backend = ScriptBackend(path, chunk_size=4)
    first, _ = asyncio.run(collect(backend, request("x")))
    second, _ = asyncio.run(collect(backend, request("x")))
    assert "".join(first) == '(:type :RESPONSE :text "one")'
    assert "".join(second) == '(:type :RESPONSE :text "two")'
    with pytest.raises(LLMError) as caught:
        asyncio.run(collect(backend, request("x")))
    assert caught.value.code == "LLM_UNAVAILABLE" and "no replies left" in caught.value.message


def test_script_jsonl_chunks_and_errors(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"chunks": ["(:type", " :RESPONSE", ' :text "a")']}) + "\n"
                    + json.dumps({"error": "RATE_LIMITED", "message": "slow down"}) + "\n")
    backend = ScriptBackend(path)
    chunks, _ = asyncio.run(collect(backend, request("x")))
    assert chunks == ["(:type", " :RESPONSE", ' :text "a")']
    with pytest.raises(LLMError) as caught:
        asyncio.run(collect(backend, request("x")))
    assert caught.value.code == "RATE_LIMITED"


def test_script_file_errors_name_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('"ok"\n{not json\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2"):
        ScriptBackend(path)
