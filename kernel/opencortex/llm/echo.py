"""The offline backend: answers with the plist a model would send, text prefixed [Echo]."""

from __future__ import annotations

import time
from typing import AsyncIterator

from opencortex.actions import printed_reply
from opencortex.llm.base import Backend, PromptRequest, Usage, estimate_tokens

ECHO_WARNING = "LLM unavailable, running in echo mode: replies repeat your message."


RECALLED_MARK = "[Recalled from earlier conversations"


def echo_text(request: PromptRequest, notice: str | None = None) -> str:
    """The reply an echo turn gives: the last user message, prefixed, as an action.

    NOTICE (why echo answers instead of the configured model) goes before the message.
    When recalled memories lead the message (see skills/chat.org), only the
    person's own words, the last paragraph, are echoed.
    """
    said = request.messages[-1].content
    if said.startswith(RECALLED_MARK):
        said = said.rsplit("\n\n", 1)[-1]
    prefix = f"[Echo] ({notice}) " if notice else "[Echo] "
    address = request.reply_to
    if address is None:
        return printed_reply("cli", "local", f"{prefix}{said}")
    text = f"* {prefix}{said}" if address.channel == "emacs" else f"{prefix}{said}"
    return printed_reply(address.channel, address.chat_id, text, address.buffer)


def split_chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class EchoBackend(Backend):
    """Needs no network and no key; the default when no LLM is configured."""

    name = "echo"

    def __init__(self, chunk_size: int = 64, warning: str | None = ECHO_WARNING):
        self.chunk_size = chunk_size
        self.warning = warning

    async def stream(self, request: PromptRequest) -> AsyncIterator[str | Usage]:
        for item in self.reply(request):
            yield item

    def reply(self, request: PromptRequest, notice: str | None = None) -> list[str | Usage]:
        """The chunks and the Usage of an echo reply (NOTICE: see `echo_text`)."""
        started = time.perf_counter()
        reply = echo_text(request, notice)
        usage = Usage(input_tokens=request.estimated_tokens(),
                      output_tokens=estimate_tokens(reply),
                      model="echo", latency_s=time.perf_counter() - started, cost_usd=0.0,
                      estimated=True, fallback_reason=notice)
        return [*split_chunks(reply, self.chunk_size), usage]
