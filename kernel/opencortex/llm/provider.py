"""What every real provider backend shares: model choice, timeouts, bounded retries, usage.

A subclass supplies three things: how to build its SDK client, `_events` (the SDK's
stream as text chunks ending with one Usage) and `_classify` (an SDK exception →
a `Failure`).  This class turns them into the Backend contract:

- the model, output cap and temperature come from the model table (`routing.py`);
- no text within `first_chunk_timeout`, or a pause over `stall_timeout` once text
  (or a reasoning model's thinking, `Thinking`) flows → STREAM_TIMEOUT;
- the thinking's text is passed on (the first piece of each attempt `fresh`: a
  retry thinks anew); it is not text of the reply, so a failure while only
  thinking came is retried as one before any text;
- a retryable failure (429, 529, 5xx) before the first chunk is retried at most
  `retries` times with exponential backoff, honouring `retry-after`;
- a failure after the first chunk is never retried (the text is already shown):
  the turn fails and the kernel archives nothing of it;
- the final Usage carries latency, time to first chunk and the cost estimate.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import logging
import random
import sys
import time
import warnings
from typing import Any, AsyncIterator

from opencortex.error_place import unexpected
from opencortex.llm.base import Backend, LLMError, PromptRequest, Thinking, Usage
from opencortex.llm.cost import estimate_cost
from opencortex.llm.failures import Failure, Provider, cut_midway, missing_key
from opencortex.llm.reported import Malformed
from opencortex.llm.routing import ModelChoice, choose_model, routing_of
from opencortex.llm.settings import LLMSettings
from opencortex.llm.watchdog import StallWatch
from opencortex.untrusted import model_note

log = logging.getLogger(__name__)


SDK_LOGGERS = ("httpx2", "httpcore2")


def quiet_sdk_logs(sdk_module: str) -> None:
    """The SDKs log whole request bodies (message content) at DEBUG: keep them at WARNING.
    And the anthropic SDK dumps each reply it builds, so pydantic warns of a field a
    server wrote as another type, quoting its value on stderr: not shown (the backends
    read those fields themselves, `reported`)."""
    for name in (sdk_module, *SDK_LOGGERS):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings",
                            category=UserWarning, module=r"pydantic\.")


def connection_reached(error: BaseException) -> bool:
    """Did the connection get through to the provider before ERROR?"""
    import httpx2
    cause = error if isinstance(error, httpx2.TransportError) else error.__cause__
    return not isinstance(cause, (httpx2.ConnectError, httpx2.ConnectTimeout,
                                  httpx2.UnsupportedProtocol))


class StreamCut(Exception):
    """The provider ended the stream without saying the reply was complete."""


def event_stream(response: Any) -> None:
    """Malformed unless RESPONSE (the SDK's httpx response) is labelled an event stream;
    asked of a stream that ended before anything came, so a login page, a proxy's
    answer or a server that ignores `stream` is named as such (a working stream
    with another label still works)."""
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "text/event-stream":
        raise Malformed(f"it answered {model_note(kind, 60) or 'with no content type'}, not an "
                        "event stream: is base_url the API's, with no proxy or login page in "
                        "the way, and does the server stream?")


class _Failed(Exception):
    """Internal: one attempt failed after CHUNKS chunks."""

    def __init__(self, failure: Failure, chunks: int):
        super().__init__(failure.message)
        self.failure = failure
        self.chunks = chunks


class ProviderBackend(Backend):
    """A model behind an SDK.  Subclasses set `name` and `sdk_module`."""

    sdk_module = ""

    def __init__(self, settings: LLMSettings, *, api_key: str | None, base_url: str,
                 key_variable: str, default_model: str, key_required: bool = True):
        self.settings = settings
        self.provider = Provider(self.name, key_variable, base_url)
        self.default_model = default_model
        self.key_required = key_required
        self._api_key = api_key
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self.key_worked = False  # a 401 after this means the key expired
        self.sleep = asyncio.sleep  # the wait between attempts (tests record it)

    @property
    def key_missing(self) -> bool:
        """True when this provider needs a key and its variable is not set."""
        return self.key_required and not self._api_key

    # -- what a subclass provides ---------------------------------------------

    @abc.abstractmethod
    def _new_client(self, api_key: str | None) -> Any:
        """The SDK's async client (the SDK is imported by then)."""

    @abc.abstractmethod
    def _events(self, client: Any, request: PromptRequest,
                choice: ModelChoice) -> AsyncIterator[str | Usage | Thinking]:
        """Text chunks (and `Thinking` while a reasoning model thinks: its text, or
        THINKING when there is none to show), then one Usage;
        raise StreamCut when the stream ends early."""

    @abc.abstractmethod
    def _classify(self, error: Exception, model: str) -> Failure | None:
        """An SDK or transport exception as a Failure; None for anything else."""

    # -- the Backend contract -------------------------------------------------

    def choice_for(self, request: PromptRequest) -> ModelChoice:
        """The model, cap and temperature REQUEST is sent with."""
        address = request.reply_to
        routing = routing_of(request.routing, address.channel if address else None,
                             address.chat_id if address else None, self.settings)
        return choose_model(self.settings, self.name, self.default_model, routing)

    def model_for(self, request: PromptRequest) -> str:
        return self.choice_for(request).model

    async def stream(self, request: PromptRequest) -> AsyncIterator[str | Thinking | Usage]:
        if self.key_missing:
            raise missing_key(self.provider)
        choice = self.choice_for(request)
        client = await self._client_for_this_loop()
        attempt = 0
        while True:
            attempt += 1
            try:
                async for item in self._attempt(client, request, choice):
                    yield item
                return
            except _Failed as failed:
                await self._after_failure(failed, attempt)

    async def _after_failure(self, failed: _Failed, attempt: int) -> None:
        """Sleep before the next attempt, or raise the error the person sees."""
        failure = failed.failure
        if failed.chunks:
            log.info("%s: stream cut after %d chunks (%s)", self.name, failed.chunks,
                     failure.code)
            raise cut_midway(failure, failed.chunks) from None
        wait = self._backoff(attempt, failure)
        settings = self.settings
        if failure.retryable and attempt <= settings.retries and wait <= settings.retry_max_wait:
            log.info("%s: %s on attempt %d of %d, retrying in %.2f s", self.name, failure.code,
                     attempt, settings.retries + 1, wait)
            await self.sleep(wait)
            return
        log.info("%s: %s on attempt %d, giving up", self.name, failure.code, attempt)
        if failure.retryable:
            if failure.code == "RATE_LIMITED":
                failure.retry_after = round(wait, 3)
            failure.message += (f"; gave up after {attempt} attempt{'s' * (attempt > 1)}: "
                                f"try again in {max(1, round(wait))} s")
        raise failure.error() from None

    def _backoff(self, attempt: int, failure: Failure) -> float:
        if failure.retry_after is not None:
            return failure.retry_after
        settings = self.settings
        delay = min(settings.retry_max_wait, settings.retry_base_delay * 2 ** (attempt - 1))
        return delay * random.uniform(0.5, 1.0)

    async def _attempt(self, client: Any, request: PromptRequest,
                       choice: ModelChoice) -> AsyncIterator[str | Thinking | Usage]:
        settings = self.settings
        started = time.perf_counter()
        first_chunk_s: float | None = None
        chunks = 0
        usage: Usage | None = None
        thinking = thought = False          # thinking came; some of it was passed on
        events = self._events(client, request, choice)
        watch = StallWatch(settings.first_chunk_timeout)
        try:
            while True:
                watch.waiting()
                try:
                    item = await anext(events)
                except StopAsyncIteration:
                    break
                watch.arrived()
                if item.__class__ is str:
                    if item:
                        if not chunks:
                            first_chunk_s = time.perf_counter() - started
                            watch.change(settings.stall_timeout)
                        chunks += 1
                        yield item
                elif item.__class__ is Thinking:   # the model works: a pause is a stall
                    if not thinking and not chunks:
                        watch.change(settings.stall_timeout)
                    thinking = True
                    if item.text:
                        yield Thinking(item.text, fresh=not thought)
                        thought = True
                else:
                    usage = item
        except asyncio.CancelledError as cancelled:
            if not watch.caused(cancelled):
                raise
            raise _Failed(self._timeout_failure(chunks), chunks) from None
        except StreamCut as cut:
            raise _Failed(Failure("LLM_UNAVAILABLE", f"{self.name} ended the stream early "
                                  f"({cut})"), chunks) from None
        except LLMError:
            raise
        except Exception as error:
            if watch.caused(error):
                raise _Failed(self._timeout_failure(chunks), chunks) from None
            failure = self._classify(error, choice.model) or self._unreadable(error)
            raise _Failed(failure, chunks) from error
        finally:
            watch.close()
            await events.aclose()
        self.key_worked = True
        usage = usage or Usage(model=choice.model, estimated=True)
        usage.latency_s = time.perf_counter() - started
        usage.first_chunk_s = first_chunk_s
        usage.cost_usd = estimate_cost(usage, settings.prices)
        yield usage

    def _unreadable(self, error: Exception) -> Failure:
        """ERROR, met reading the stream, as the provider's reply being unreadable: said
        by what broke the protocol or where reading failed, never by quoting what came.
        Not retried: a server that writes a field wrongly does so again, and each
        attempt is paid for."""
        why = str(error) if isinstance(error, Malformed) else unexpected(error)
        log.warning("%s: unreadable stream (%s)", self.name, why)
        return Failure("LLM_UNAVAILABLE", f"{self.name} sent a reply that cannot be read "
                       f"({why})")

    def _timeout_failure(self, chunks: int) -> Failure:
        settings = self.settings
        if chunks:
            return Failure("STREAM_TIMEOUT", f"{self.name} sent nothing for "
                           f"{settings.stall_timeout:g} s (stall_timeout)")
        return Failure("STREAM_TIMEOUT", f"{self.name} sent no reply within "
                       f"{settings.first_chunk_timeout:g} s (first_chunk_timeout); "
                       "send the message again")

    async def _client_for_this_loop(self) -> Any:
        """One client per event loop (connections belong to the loop that opened them)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            if self.sdk_module not in sys.modules:  # ~1 s: keep the loop running meanwhile
                await asyncio.to_thread(importlib.import_module, self.sdk_module)
            quiet_sdk_logs(self.sdk_module)
            self._client = self._new_client(self._api_key)
            self._client_loop = loop
        return self._client

    def _timeouts(self) -> Any:
        """httpx2 timeouts: connect/write/pool bounded; reading is bounded by `_attempt`."""
        import httpx2
        limit = self.settings.connect_timeout
        return httpx2.Timeout(connect=limit, read=None, write=limit, pool=limit)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._client_loop is asyncio.get_running_loop():
            await client.close()
