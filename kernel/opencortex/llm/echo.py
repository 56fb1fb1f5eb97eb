"""The offline backend: answers with the plist a model would send, text prefixed [Echo]."""

from __future__ import annotations

import time
from typing import AsyncIterator

from opencortex.actions import reply_action
from opencortex.llm.base import Backend, PromptRequest, Usage, estimate_tokens

ECHO_WARNING = "LLM unavailable, running in echo mode: replies repeat your message."


def echo_text(request: PromptRequest) -> str:
    """The reply an echo turn gives: the last user message, prefixed, as an action."""
    said = request.messages[-1].content
    address = request.reply_to
    if address is None:
        return reply_action("cli", "local", f"[Echo] {said}").printed()
    text = f"* [Echo] {said}" if address.channel == "emacs" else f"[Echo] {said}"
    return reply_action(address.channel, address.chat_id, text, address.buffer).printed()


def split_chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class EchoBackend(Backend):
    """Needs no network and no key; the default when no LLM is configured."""

    name = "echo"

    def __init__(self, chunk_size: int = 64, warning: str | None = ECHO_WARNING):
        self.chunk_size = chunk_size
        self.warning = warning

    async def stream(self, request: PromptRequest) -> AsyncIterator[str | Usage]:
        started = time.perf_counter()
        reply = echo_text(request)
        for chunk in split_chunks(reply, self.chunk_size):
            yield chunk
        prompt = request.system + "".join(m.content for m in request.messages)
        yield Usage(input_tokens=estimate_tokens(prompt), output_tokens=estimate_tokens(reply),
                    model="echo", latency_s=time.perf_counter() - started, estimated=True)
