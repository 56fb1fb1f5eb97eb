"""The backend interface: a prompt request in, streamed text chunks and usage out.

Law (tested for every backend): the concatenation of the chunks a backend
yields is the complete reply.  After the last chunk a backend yields exactly
one `Usage`.  A reasoning model's thinking comes as `Thinking` items among
them: shown to the person who asked, never part of the reply, never kept.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Mapping
from typing import Any, AsyncIterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ErrorCode = Literal["RATE_LIMITED", "STREAM_TIMEOUT", "LLM_UNAVAILABLE",
                    "INVALID_MESSAGE", "SESSION_EXPIRED"]


class LLMError(Exception):
    """A backend failed; CODE is one of the chat design's wire error codes."""

    def __init__(self, code: ErrorCode, message: str, *, retry_after_seconds: float | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_seconds = retry_after_seconds


class Thinking:
    """A piece of a reasoning model's thinking, as a backend yields it: TEXT to show the
    person watching (model text, untrusted like the reply), never part of the reply nor
    archived.  FRESH: the first piece of an attempt (a retried request thinks anew, so
    what was shown of an earlier attempt goes)."""

    __slots__ = ("text", "fresh")

    def __init__(self, text: str = "", fresh: bool = False):
        self.text = text
        self.fresh = fresh

    def __repr__(self) -> str:
        return f"Thinking({len(self.text)} chars{', fresh' if self.fresh else ''})"


THINKING = Thinking()   # a sign the model works, with nothing to show (keeps a stream alive)


class PromptMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant"]
    content: str


class ReplyAddress(BaseModel):
    """Where the reply should go; filled in by the kernel, not by skills."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: str
    chat_id: str
    buffer: str


class PromptRequest(BaseModel):
    """What a skill's probabilistic phase asks the kernel to send to the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = ""
    messages: list[PromptMessage] = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)
    reply_to: ReplyAddress | None = None
    # Filled by the kernel: {"archetype": ..., "skill": ..., "channel": ...}; picks the model.
    routing: dict[str, str] = Field(default_factory=dict)

    def estimated_tokens(self) -> int:
        """The prompt's tokens (system and messages), counted as `estimate_tokens` does."""
        return tokens_in_chars(len(self.system) + sum(len(m.content) for m in self.messages))

    def with_retry_note(self, reply: str, reason: str) -> "PromptRequest":
        """This request plus the rejected reply and why it was rejected."""
        note = (f"Your reply was rejected: {reason}\n"
                "Answer again with exactly one property list and nothing else.")
        if len(reply) > RETRY_ECHO_CHARS:   # a hostile reply is not sent back in full
            reply = (reply[:RETRY_ECHO_CHARS]
                     + f"\n[… {len(reply) - RETRY_ECHO_CHARS} more characters not shown]")
        messages = [*self.messages, PromptMessage(role="assistant", content=reply or "(empty)"),
                    PromptMessage(role="user", content=note)]
        return self.model_copy(update={"messages": messages})


    def with_step_result(self, reply: str, result: str) -> "PromptRequest":
        """This request plus the model's REPLY (a tool call) and the step's RESULT."""
        messages = [*self.messages, PromptMessage(role="assistant", content=reply or "(empty)"),
                    PromptMessage(role="user", content=result)]
        return self.model_copy(update={"messages": messages})


RETRY_ECHO_CHARS = 4000  # of a rejected reply repeated to the model on a re-ask
REMEMBERED_CHARS = 1200  # a message this long or shorter is validated once, then remembered


def prompt_request(built: Mapping[str, Any]) -> PromptRequest:
    """BUILT, a prompt request as a skill wrote it, validated as a PromptRequest.

    A thread's history is sent again every turn, so each short message that
    validates is validated once and its (immutable) PromptMessage remembered;
    any other item is left to the request's validation, which reports it.  (A
    skill that keeps its PromptMessages, as the chat skill does, costs least.)"""
    data = dict(built)
    messages = data.get("messages")
    if type(messages) is list and dict in set(map(type, messages)):
        data["messages"] = [_remembered(item) for item in messages]
    return PromptRequest.model_validate(data)


def _remembered(item: Any) -> Any:
    """ITEM as a remembered PromptMessage when it is a short {"role", "content"} dict of
    strings that validates; else ITEM itself."""
    if type(item) is dict and len(item) == 2 and type(item.get("role")) is str \
            and type(content := item.get("content")) is str and len(content) <= REMEMBERED_CHARS:
        try:
            return _message(item["role"], content)
        except ValidationError:
            return item
    return item


@functools.lru_cache(maxsize=16384)        # every open thread's history, round-robin
def _message(role: str, content: str) -> PromptMessage:
    return PromptMessage(role=role, content=content)


class Usage(BaseModel):
    """What one reply cost; `estimated` when the backend had to count itself.

    `input_tokens` counts every prompt token; `cache_read_tokens` and
    `cache_write_tokens` are the prompt-cache hits and writes among them.
    `cost_usd` is None when the model has no price in `[llm.prices]`.
    `fallback_reason` is set when echo answered because the configured
    provider could not be reached (the reply text says so too).
    """

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    stop_reason: str = "end_turn"
    model: str = ""
    latency_s: float = 0.0
    first_chunk_s: float | None = None
    cost_usd: float | None = None
    estimated: bool = False
    fallback_reason: str | None = None


def estimate_tokens(text: str) -> int:
    """A rough count (about four characters a token) for backends that report none."""
    return tokens_in_chars(len(text))


def tokens_in_chars(count: int) -> int:
    """`estimate_tokens` of a text of COUNT characters."""
    return max(1, (count + 3) // 4) if count else 0


class Backend(abc.ABC):
    """A source of replies.  `stream` yields str chunks (and `Thinking`), then one Usage."""

    name: str = "backend"
    warning: str | None = None  # shown to the person whenever this backend answers

    @abc.abstractmethod
    def stream(self, request: PromptRequest) -> AsyncIterator[str | Thinking | Usage]:
        """Stream the reply to REQUEST; raise LLMError on failure."""

    def model_for(self, request: PromptRequest) -> str:
        """The model REQUEST goes to ("" when the backend has none: nothing is paid)."""
        return ""

    async def aclose(self) -> None:
        """Release connections; the default has none."""
