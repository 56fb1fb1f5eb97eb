"""How a provider's failure becomes one of the chat design's error codes.

| what happened                                   | code            | retried | echo fallback |
|-------------------------------------------------+-----------------+---------+---------------|
| 429 rate limit, 529 / overloaded_error          | RATE_LIMITED    | yes     | no            |
| 429 spend limit reached                         | RATE_LIMITED    | no      | no            |
| no text within first_chunk_timeout, or a stall  | STREAM_TIMEOUT  | no      | no            |
| 408 request timeout                             | STREAM_TIMEOUT  | yes     | no            |
| cannot connect (refused, DNS, connect timeout)  | LLM_UNAVAILABLE | no      | yes           |
| 500 / 502 / 503 / 504 (after the retries)       | LLM_UNAVAILABLE | yes     | yes           |
| an error event in the stream before any text    | by its type     | by type | no            |
| key missing, refused (401) or not allowed (403) | LLM_UNAVAILABLE | no      | missing: yes  |
| model not found (404)                           | LLM_UNAVAILABLE | no      | no            |
| the stream broke after text arrived             | the cause's     | no      | no            |
| a stream the API does not allow (`reported`)    | LLM_UNAVAILABLE | no      | no            |
| 400 / 413 / 422 and other 4xx                   | INVALID_MESSAGE | no      | no            |
| 401 after this key had worked in this run       | SESSION_EXPIRED | no      | no            |

Retries happen only before the first chunk: text already shown is never repeated.
Messages name the environment variable to set, never a key.
"""

from __future__ import annotations

import email.utils
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

from opencortex.llm.base import ErrorCode, LLMError
from opencortex.untrusted import model_note

SERVER_DOWN_STATUS = frozenset({500, 502, 503, 504})
SPEND_LIMIT_CODES = frozenset({"enforced_spend_limit_reached", "insufficient_quota"})
MAX_RETRY_AFTER = 7 * 24 * 3600.0  # seconds; a longer wait asked for is reported as this
KIND_LIMIT = 60                    # characters of the provider's error type quoted back
SAID_LIMIT = 200                   # characters of the provider's error message quoted back


class ProviderUnreachable(LLMError):
    """LLM_UNAVAILABLE before any text: the provider could not be reached (echo may stand in)."""

    def __init__(self, message: str):
        super().__init__("LLM_UNAVAILABLE", message)


@dataclass
class Failure:
    """One failed attempt, classified."""

    code: ErrorCode
    message: str
    retryable: bool = False
    retry_after: float | None = None
    unreachable: bool = False

    def error(self) -> LLMError:
        if self.unreachable:
            return ProviderUnreachable(self.message)
        return LLMError(self.code, self.message, retry_after_seconds=self.retry_after)


@dataclass(frozen=True)
class Provider:
    """What messages about a provider need to name."""

    name: str
    key_variable: str
    base_url: str


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The wait a response asks for: `retry-after-ms`, `retry-after` seconds or HTTP date;
    None when it asks for none or for one that is not a time (a word, an infinite number,
    a date that is no date), at most MAX_RETRY_AFTER."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return _wait(float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return _wait(float(value))
    except ValueError:
        pass
    try:
        return _wait(email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (ValueError, TypeError, OverflowError):
        return None


def _wait(seconds: float) -> float | None:
    """SECONDS as a wait: none below zero, at most MAX_RETRY_AFTER; None if not finite."""
    return min(max(0.0, seconds), MAX_RETRY_AFTER) if math.isfinite(seconds) else None


def _error_field(body: Any, *path: str) -> str | None:
    for key in path:
        if not isinstance(body, Mapping):
            return None
        body = body.get(key)
    return body if isinstance(body, str) else None


def status_failure(provider: Provider, model: str, status: int, body: Any,
                   headers: Mapping[str, str] | None, *, key_worked: bool) -> Failure:
    """A failure the provider answered with an HTTP status (or an SSE error event, status 200)."""
    kind = _error_field(body, "error", "type") or _error_field(body, "type") or ""
    code = (_error_field(body, "error", "details", "error_code")
            or _error_field(body, "error", "code") or _error_field(body, "code") or "")
    said = model_note(_error_field(body, "error", "message") or _error_field(body, "message"),
                      SAID_LIMIT)
    shown = model_note(kind, KIND_LIMIT)   # the provider's words: one short visible line
    what = f"{status} {shown}".strip() if status != 200 else (shown or "error event")
    name, variable = provider.name, provider.key_variable
    if status in (429, 529) or kind in ("rate_limit_error", "overloaded_error"):
        wait = retry_after_seconds(headers)
        if code in SPEND_LIMIT_CODES:
            return Failure("RATE_LIMITED", f"{name} refuses more requests on this key until its "
                           f"spend limit resets ({what}); raise the limit or wait")
        busy = "is overloaded" if status == 529 or kind == "overloaded_error" \
            else "is rate limiting this key"
        return Failure("RATE_LIMITED", f"{name} {busy} ({what})", retryable=True,
                       retry_after=wait)
    if status == 401 or kind == "authentication_error":
        if key_worked:
            return Failure("SESSION_EXPIRED", f"{name} no longer accepts the key in {variable} "
                           f"({what}); it worked earlier in this run: set a fresh key in "
                           f"{variable} and restart")
        return Failure("LLM_UNAVAILABLE", f"{name} refused the key in {variable} ({what}): "
                       f"set {variable} to a valid key and restart")
    if status == 403 or kind == "permission_error":
        return Failure("LLM_UNAVAILABLE", f"the key in {variable} may not use {model} on {name} "
                       f"({what}); choose another model or key")
    if status == 404 or kind == "not_found_error":
        return Failure("LLM_UNAVAILABLE", f"{name} at {provider.base_url} has no model {model} "
                       f"({what}); set `model` in [llm.{name}] or pass --model")
    if status == 408:
        return Failure("STREAM_TIMEOUT", f"{name} timed out on the request ({what})",
                       retryable=True, retry_after=retry_after_seconds(headers))
    if status in SERVER_DOWN_STATUS or kind in ("api_error", "server_error"):
        return Failure("LLM_UNAVAILABLE", f"{name} failed on its side ({what})",
                       retryable=True, retry_after=retry_after_seconds(headers),
                       unreachable=status != 200)
    detail = f": {said}" if said else ""
    if kind == "invalid_request_error" or 400 <= status < 500:
        return Failure("INVALID_MESSAGE", f"{name} refused the request ({what}{detail})")
    return Failure("LLM_UNAVAILABLE", f"{name} reported an error ({what}{detail})")


def connection_failure(provider: Provider, error: BaseException, *, reached: bool) -> Failure:
    """The connection failed: before reaching the provider (REACHED false) or while reading."""
    cause = error.__cause__ or error.__context__ or error
    reason = type(cause).__name__
    if not reached:
        return Failure("LLM_UNAVAILABLE", f"cannot reach {provider.name} at {provider.base_url} "
                       f"({reason})", unreachable=True)
    return Failure("LLM_UNAVAILABLE", f"the connection to {provider.name} broke ({reason})")


def missing_key(provider: Provider) -> ProviderUnreachable:
    return ProviderUnreachable(f"{provider.key_variable} is not set: export "
                               f"{provider.key_variable}=… to use {provider.name}")


def cut_midway(failure: Failure, chunks: int) -> LLMError:
    """A failure after CHUNKS pieces of text were already streamed."""
    return LLMError(failure.code, f"the reply was cut off after {chunks} "
                    f"chunk{'s' * (chunks != 1)} "
                    f"({failure.message}); nothing of it was saved: send the message again",
                    retry_after_seconds=failure.retry_after)
