"""Claude through the official `anthropic` SDK: Messages API, streamed with `messages.stream`.

The SDK is imported on the first reply, not at kernel start (it costs about a
second).  The system prompt — the skill's mandate, reply formats and the
persona, the same for every turn of a thread — is sent as one text block
marked `cache_control: ephemeral`; the history and the new message come after
it, so a cache hit covers everything that does not change.  `temperature` is
not sent: the API version this SDK speaks refuses sampling parameters.

Claude's thinking (`[llm.anthropic] thinking`, or the model's default) streams as
thinking blocks before the text: their words are passed on as `Thinking`, and a
redacted block or a signature keeps the stream alive without words to show.
"""

from __future__ import annotations

import os
from typing import Any, AsyncIterator

from opencortex.llm import reported
from opencortex.llm.base import (THINKING, LLMError, PromptRequest, Thinking, Usage,
                                 estimate_tokens)
from opencortex.llm.failures import Failure, connection_failure, status_failure
from opencortex.llm.provider import ProviderBackend, StreamCut, connection_reached, event_stream
from opencortex.llm.routing import ModelChoice
from opencortex.llm.settings import LLMSettings

DEFAULT_BASE_URL = "https://api.anthropic.com"


class AnthropicBackend(ProviderBackend):
    """Streams replies from the Anthropic Messages API."""

    name = "anthropic"
    sdk_module = "anthropic"

    def __init__(self, settings: LLMSettings, *, api_key: str | None = None,
                 base_url: str | None = None):
        own = settings.anthropic
        variable = own.api_key_env
        super().__init__(
            settings,
            api_key=api_key if api_key is not None else os.environ.get(variable) or None,
            base_url=(base_url or own.base_url or os.environ.get("ANTHROPIC_BASE_URL")
                      or DEFAULT_BASE_URL),
            key_variable=variable, default_model=own.model)
        self.prompt_cache = own.prompt_cache
        self.thinking = own.thinking

    def _new_client(self, api_key: str | None) -> Any:
        import anthropic
        # max_retries=0: retries are ours (bounded, retry-after honoured, never mid-stream).
        return anthropic.AsyncAnthropic(api_key=api_key or "", base_url=self.provider.base_url,
                                        max_retries=0, timeout=self._timeouts())

    def request_params(self, request: PromptRequest, choice: ModelChoice) -> dict[str, Any]:
        """The Messages API parameters for REQUEST."""
        params: dict[str, Any] = {
            "model": choice.model, "max_tokens": choice.max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages]}
        if request.system:
            if self.prompt_cache:
                params["system"] = [{"type": "text", "text": request.system,
                                     "cache_control": {"type": "ephemeral"}}]
            else:
                params["system"] = request.system
        # No temperature: API version 2026-10-21 (SDK 2.x) refuses every sampling parameter.
        if isinstance(self.thinking, int):
            if self.thinking >= choice.max_tokens:    # the API would refuse it (400)
                raise LLMError("LLM_UNAVAILABLE", f"[llm.anthropic] thinking = {self.thinking} "
                               f"needs a larger max_tokens than {choice.model}'s "
                               f"{choice.max_tokens}: set [llm] max_tokens (or the model "
                               "row's) above the thinking budget")
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking}
        elif self.thinking is not None:
            params["thinking"] = {"type": self.thinking}
        return params

    async def _events(self, client: Any, request: PromptRequest,
                      choice: ModelChoice) -> AsyncIterator[str | Thinking | Usage]:
        async with client.messages.stream(**self.request_params(request, choice)) as stream:
            async for event in stream:
                kind = event.type
                if kind == "text":
                    yield reported.text(event.text, "a text delta")
                elif kind == "thinking":
                    yield Thinking(reported.text(event.thinking, "a thinking delta"))
                elif kind == "signature" or (kind == "content_block_start" and getattr(
                        event.content_block, "type", None) == "redacted_thinking"):
                    yield THINKING
            try:
                message = await stream.get_final_message()
            except AssertionError:  # the stream ended before message_start
                event_stream(stream.response)
                message = None
        if message is None or message.stop_reason is None:
            raise StreamCut("no message_stop")
        yield _usage(message, request, choice.model)

    def _classify(self, error: Exception, model: str) -> Failure | None:
        import anthropic
        import httpx2
        if isinstance(error, anthropic.APIStatusError):
            return status_failure(self.provider, model, error.status_code, error.body,
                                  error.response.headers, key_worked=self.key_worked)
        if isinstance(error, (anthropic.APIConnectionError, httpx2.TransportError)):
            return connection_failure(self.provider, error, reached=connection_reached(error))
        if isinstance(error, anthropic.APIError):
            return Failure("LLM_UNAVAILABLE", f"{self.name} sent a response the SDK cannot read "
                           f"({type(error).__name__})")
        return None


def _usage(message: Any, request: PromptRequest, model: str) -> Usage:
    """What MESSAGE (the SDK's whole reply) cost: its counts when they are whole numbers
    a reply could use, else estimated; MODEL when it names none."""
    stop = reported.reason(message.stop_reason, "stop_reason") or "end_turn"
    model = reported.name(message.model) or model
    counted = message.usage
    read = reported.tokens(getattr(counted, "cache_read_input_tokens", 0) or 0)
    written = reported.tokens(getattr(counted, "cache_creation_input_tokens", 0) or 0)
    uncached = reported.tokens(getattr(counted, "input_tokens", None))
    output = reported.tokens(getattr(counted, "output_tokens", None))
    if None in (read, written, uncached, output):
        text = "".join(block.text for block in message.content
                       if isinstance(getattr(block, "text", None), str))
        prompt = request.system + "".join(m.content for m in request.messages)
        return Usage(input_tokens=estimate_tokens(prompt), output_tokens=estimate_tokens(text),
                     stop_reason=stop, model=model, estimated=True)
    return Usage(input_tokens=uncached + read + written, output_tokens=output,
                 cache_read_tokens=read, cache_write_tokens=written, stop_reason=stop,
                 model=model)
