"""Loopback imitations of the two provider APIs, for tests and bench/bench_llm.py.

One aiohttp server on 127.0.0.1 (its own thread and event loop) answers
- `POST /v1/messages` like the Anthropic Messages API: SSE `message_start`,
  `content_block_start`, `content_block_delta` × n, `content_block_stop`,
  `message_delta`, `message_stop` (see shared/KNOWLEDGE.md);
- `POST /v1/chat/completions` like an OpenAI-compatible server: SSE `data:`
  chunks, a finish_reason chunk, a usage chunk, `data: [DONE]`.
Each request takes the next queued `Reply` (or the `repeat` one), which can also
fail: an HTTP error with `retry-after`, an SSE error event, a dropped connection,
a stall, a stream that ends without its final event, or (`raw`) any SSE events as
given, to be a server that breaks its protocol.  Every request is recorded.

`python tests/llm_fakes.py --chunks 2000` serves a fixed reply in a process of
its own (prints the port first; stops when stdin closes) for benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

STALL_LIMIT = 60.0  # a stalled reply ends after this long even if nobody stops the server


@dataclass
class Reply:
    """What the fake provider answers to one request."""

    chunks: list[str] = field(default_factory=lambda: ["Hel", "lo"])
    thinking: list[str] = field(default_factory=list)  # streamed first: a reasoning model's
    status: int = 200  # not 200: a JSON error body instead of a stream
    error_type: str = ""  # error.type of the error body or event
    error_code: str | None = None  # error.details.error_code (Anthropic) / error.code (OpenAI)
    error_message: str = "fake provider error"  # error.message of the error body
    headers: dict[str, str] = field(default_factory=dict)
    error_after: int | None = None  # an SSE error event after this many chunks
    break_after: int | None = None  # drop the connection after this many chunks
    stall_after: int | None = None  # send nothing more after this many chunks
    no_stop: bool = False  # end the body cleanly without message_stop / finish_reason
    input_tokens: int = 11
    output_tokens: int = 7
    cache_read: int = 0
    cache_write: int = 0
    stop_reason: str = "end_turn"
    delay: float = 0.0  # seconds before each chunk
    burst: bool = False  # send the whole stream in one write (benchmarks: the client is timed)
    raw: list[tuple[str | None, str]] | None = None  # instead: these SSE events, as written
    no_stream_options: bool = False  # OpenAI: refuse a request carrying stream_options (400)
    refuses: tuple[str, ...] = ()  # OpenAI: refuse a request with these parameters (a
                                   # reasoning model: "max_tokens", "temperature"; 400)


@dataclass
class Seen:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _refusal(name: str, value: Any) -> dict[str, Any]:
    """The error OpenAI's API answers a reasoning model's request with when it holds
    the parameter NAME (as VALUE)."""
    if name == "temperature":
        return {"message": f"Unsupported value: 'temperature' does not support {value} with "
                           "this model. Only the default (1) value is supported.",
                "type": "invalid_request_error", "param": name, "code": "unsupported_value"}
    other = "max_completion_tokens" if name == "max_tokens" else "max_tokens"
    return {"message": f"Unsupported parameter: '{name}' is not supported with this model. "
                       f"Use '{other}' instead.",
            "type": "invalid_request_error", "param": name, "code": "unsupported_parameter"}


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class _Out:
    """The response body, written piece by piece or (burst) all at once at the end."""

    def __init__(self, response: web.StreamResponse, burst: bool):
        self.response = response
        self.pending: list[bytes] | None = [] if burst else None

    async def write(self, data: bytes) -> None:
        if self.pending is None:
            await self.response.write(data)
        else:
            self.pending.append(data)

    async def flush(self) -> web.StreamResponse:
        if self.pending:
            await self.response.write(b"".join(self.pending))
            self.pending.clear()
        return self.response


class FakeProvider:
    """The server; use as a context manager (it binds 127.0.0.1 and stops on exit)."""

    def __init__(self, repeat: Reply | None = None):
        self.repeat = repeat
        self.queue: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    def push(self, *replies: Reply) -> None:
        self.queue.extend(replies)

    def __enter__(self) -> "FakeProvider":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/chat/completions", self._openai)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _stop(self) -> None:
        assert self._stopping is not None and self._runner is not None
        self._stopping.set()
        await self._runner.cleanup()

    async def _next(self, request: web.Request) -> Reply | None:
        body = await request.json()
        self.requests.append(Seen(request.path, dict(request.headers), body))
        return self.queue.popleft() if self.queue else self.repeat

    async def _stall(self) -> None:
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), STALL_LIMIT)
        except asyncio.TimeoutError:
            pass

    # -- Anthropic ------------------------------------------------------------

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        reply = await self._next(request)
        if reply is None:
            reply = Reply(status=500, error_type="api_error")
        if reply.status != 200:
            error: dict[str, Any] = {"type": reply.error_type or "api_error",
                                     "message": reply.error_message}
            if reply.error_code:
                error["details"] = {"error_code": reply.error_code}
            return web.json_response({"type": "error", "error": error}, status=reply.status,
                                     headers=reply.headers)
        if reply.raw is not None:
            return await self._raw(request, reply)
        model = (await request.json())["model"]
        response = web.StreamResponse(headers={"content-type": "text/event-stream",
                                               **reply.headers})
        await response.prepare(request)
        out = _Out(response, reply.burst)
        usage = {"input_tokens": reply.input_tokens, "output_tokens": 1,
                 "cache_read_input_tokens": reply.cache_read,
                 "cache_creation_input_tokens": reply.cache_write}
        await out.write(_sse("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}}))
        index = 0
        if reply.thinking:           # a thinking block, its signature last, then the text's
            await out.write(_sse("content_block_start", {
                "type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
            for thought in reply.thinking:
                await out.write(_sse("content_block_delta", {
                    "type": "content_block_delta", "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": thought}}))
            await out.write(_sse("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}))
            await out.write(_sse("content_block_stop", {"type": "content_block_stop",
                                                         "index": 0}))
            index = 1
        await out.write(_sse("content_block_start", {
            "type": "content_block_start", "index": index,
            "content_block": {"type": "text", "text": ""}}))
        await out.write(_sse("ping", {"type": "ping"}))
        for number, text in enumerate(reply.chunks):
            if await self._interrupt(reply, number, request, out, anthropic=True):
                return await out.flush()
            await out.write(_sse("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": text}}))
        if await self._interrupt(reply, len(reply.chunks), request, out, anthropic=True):
            return await out.flush()
        if reply.no_stop:
            return await out.flush()
        await out.write(_sse("content_block_stop", {"type": "content_block_stop",
                                                         "index": index}))
        await out.write(_sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens}}))
        await out.write(_sse("message_stop", {"type": "message_stop"}))
        return await out.flush()

    async def _raw(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        """REPLY's raw SSE events, each `event:` (when named) and `data:` as given."""
        response = web.StreamResponse(headers={"content-type": "text/event-stream",
                                               **reply.headers})
        await response.prepare(request)
        try:
            for event, data in reply.raw or ():
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                head = f"event: {event}\n" if event else ""
                await response.write(f"{head}data: {data}\n\n".encode())
        except ConnectionError:   # the client stopped reading what it could not read
            pass
        return response

    async def _interrupt(self, reply: Reply, number: int, request: web.Request,
                         out: _Out, *, anthropic: bool) -> bool:
        """Delay, or fail the stream at chunk NUMBER as REPLY asks; True when it ended."""
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if number in (reply.error_after, reply.break_after, reply.stall_after):
            await out.flush()
        if reply.error_after == number:
            error = {"type": reply.error_type or "api_error", "message": "fake stream error"}
            if anthropic:
                await out.write(_sse("error", {"type": "error", "error": error}))
            else:
                await out.write(_sse(None, {"error": error}))
            return True
        if reply.break_after == number:
            assert request.transport is not None
            request.transport.close()
            return True
        if reply.stall_after == number:
            await self._stall()
            return True
        return False

    # -- OpenAI-compatible ----------------------------------------------------

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        reply = await self._next(request)
        if reply is None:
            reply = Reply(status=500, error_type="server_error")
        if reply.status != 200:
            return web.json_response(
                {"error": {"message": reply.error_message, "type": reply.error_type or None,
                           "code": reply.error_code}},
                status=reply.status, headers=reply.headers)
        if reply.raw is not None:
            return await self._raw(request, reply)
        body = await request.json()
        if reply.no_stream_options and "stream_options" in body:   # as older Azure versions
            self.queue.appendleft(reply)           # the retry without it gets this reply
            return web.json_response({"error": {
                "message": "Unrecognized request argument supplied: stream_options",
                "type": "invalid_request_error", "param": None, "code": None}}, status=400)
        refused = next((name for name in reply.refuses if name in body), None)
        if refused:                                # as the API answers for o3, gpt-5
            self.queue.appendleft(reply)           # the request asked again gets it
            return web.json_response({"error": _refusal(refused, body[refused])}, status=400)
        response = web.StreamResponse(headers={"content-type": "text/event-stream",
                                               **reply.headers})
        await response.prepare(request)
        out = _Out(response, reply.burst)
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": body["model"]}

        def choice(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse(None, {**base, "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish}]})

        await out.write(choice({"role": "assistant", "content": ""}))
        for thought in reply.thinking:   # as llama.cpp, vLLM and DeepSeek write it
            await out.write(choice({"reasoning_content": thought}))
        for number, text in enumerate(reply.chunks):
            if await self._interrupt(reply, number, request, out, anthropic=False):
                return await out.flush()
            await out.write(choice({"content": text}))
        if await self._interrupt(reply, len(reply.chunks), request, out, anthropic=False):
            return await out.flush()
        if reply.no_stop:
            return await out.flush()
        finish = {"end_turn": "stop", "max_tokens": "length",
                  "refusal": "content_filter"}.get(reply.stop_reason, "stop")
        await out.write(choice({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            await out.write(_sse(None, {**base, "choices": [], "usage": {
                "prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens,
                "prompt_tokens_details": {"cached_tokens": reply.cache_read}}}))
        await out.write(b"data: [DONE]\n\n")
        return await out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--text", default="x", help="text of every chunk")
    parser.add_argument("--burst", action="store_true", help="each reply in one write")
    parser.add_argument("--plist", action="store_true",
                        help="first and last chunk make the reply one CLI reply plist")
    args = parser.parse_args()
    chunks = [args.text] * args.chunks
    if args.plist and args.chunks >= 2:
        chunks[0], chunks[-1] = '(:type :REQUEST :target :cli :text "', '")'
    with FakeProvider(repeat=Reply(chunks=chunks, burst=args.burst)) as fake:
        print(fake.port, flush=True)
        sys.stdin.read()  # until the parent closes stdin


if __name__ == "__main__":
    main()
