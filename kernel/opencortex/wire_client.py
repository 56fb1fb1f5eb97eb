"""`opencortex client`: a terminal chat over the ChatEvent wire, the protocol's
reference client.

It reads lines (one message each; a line starting with / is a command), prints
the reply's words as its ``chunk`` events arrive, then ends the line when the
verified ``message`` matches them (or prints the message when it does not:
a retry, or a reply that was not streamed).  An ``approval`` event is shown from
its kernel facts (the model's note quoted and marked as unverified), and the
next line answers it: y or yes approves, anything else denies.  Errors go to
stderr with their code.  Every piece of model text is printed through
`opencortex.untrusted.visible`: an escape sequence is shown, never obeyed.

When the connection drops, the client reconnects with its session id and the
last sequence it saw, so the turn in flight continues where it was; events it
had already seen are skipped by sequence.  /quit (or the end of the input)
leaves; Ctrl-C while a reply is on its way aborts that turn.

The URL and token come from the options, `$OPENCORTEX_WS_TOKEN`, or the
kernel's connection file (``ws_port``, and ``ws_token`` or ``secret``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Sequence, TextIO

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from opencortex.interrupts import sigint_calls
from opencortex.untrusted import model_note, visible
from opencortex.wire_protocol import DEFAULT_THREAD, VERSION

MAX_EVENT_BYTES = 64 << 20      # a verified reply of max_reply_bytes, JSON-escaped
RECONNECT_DELAYS = (0.1, 0.3, 1.0, 2.0, 4.0)
LEAVE = ("/quit", "/exit")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class WireError(Exception):
    """The client cannot go on (connection refused, authentication failed)."""


class LineSource:
    """Lines of a text stream, read by a daemon thread (so leaving never waits for one)."""

    def __init__(self, stream: TextIO):
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def pump() -> None:
            for line in iter(stream.readline, ""):
                loop.call_soon_threadsafe(self.queue.put_nowait, line.rstrip("\n"))
            loop.call_soon_threadsafe(self.queue.put_nowait, None)

        threading.Thread(target=pump, daemon=True, name="opencortex-client-input").start()

    async def next(self) -> str | None:
        """The next line, or None at the end of the input."""
        return await self.queue.get()


class WireClient:
    """One chat over the wire; see the module docstring."""

    def __init__(self, url: str, token: str, thread: str, *, out: TextIO, err: TextIO,
                 reconnect_delays: Sequence[float] = RECONNECT_DELAYS):
        self.url, self.token, self.thread = url, token, thread
        self.out, self.err = out, err
        self.reconnect_delays = reconnect_delays
        self.ws: ClientConnection | None = None
        self.session_id: str | None = None
        self.last_sequence = 0
        self.serial = 0
        self.waiting: str | None = None          # correlation id of the turn or command
        self.approval: dict[str, Any] | None = None
        self.streamed: list[str] = []            # chunks of the current attempt
        self.thinking = False                    # a thought is shown, its line open
        self.attempt = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.leaving = False
        self.stopped = asyncio.Event()           # Ctrl-C with nothing in flight: leave

    # -- the connection -----------------------------------------------------------

    async def connect(self) -> None:
        """Connect and authenticate (resuming the session when there is one)."""
        try:
            self.ws = await connect(self.url, proxy=None, max_size=MAX_EVENT_BYTES,
                                    compression=None, open_timeout=10)
        except (OSError, InvalidHandshake, TimeoutError) as error:
            raise WireError(f"cannot connect to {self.url}: {error}") from None
        auth = {"token": self.token, "last_sequence": self.last_sequence}
        if self.session_id:
            auth["session_id"] = self.session_id
        await self.send("auth", auth)

    async def send(self, action: str, data: dict[str, Any]) -> None:
        if self.ws is None:
            raise WireError("not connected")
        await self.ws.send(json.dumps({"action": action, "version": VERSION, "data": data}))

    async def listen(self) -> None:
        """Handle events until the connection ends; reconnect unless leaving."""
        while True:
            try:
                assert self.ws is not None
                async for raw in self.ws:
                    self.handle(json.loads(raw))
            except ConnectionClosed:
                pass
            if self.leaving:
                return
            code, reason = self.ws.close_code, self.ws.close_reason
            if code == 1008 and "authentication" in (reason or ""):
                raise WireError(f"the kernel refused the token: {reason}")
            await self.reconnect(code, reason)

    async def reconnect(self, code: int | None, reason: str | None) -> None:
        self.note(f"(connection lost: {code} {visible(reason or '')}; reconnecting)")
        for delay in self.reconnect_delays:
            await asyncio.sleep(delay)
            try:
                await self.connect()
                return
            except (WireError, ConnectionClosed):
                continue
        raise WireError(f"the connection to {self.url} is lost and did not come back")

    # -- events -----------------------------------------------------------------

    def handle(self, event: dict[str, Any]) -> None:
        """One event from the kernel (one already seen, by sequence, is skipped)."""
        sequence, kind = event.get("sequence", 0), event.get("event")
        data = event.get("data") or {}
        if kind == "session" and not data.get("resumed"):
            self.last_sequence = 0              # a new session counts from 1
        if sequence <= self.last_sequence:
            return
        self.last_sequence = sequence
        handler = getattr(self, f"on_{kind}", None)
        if handler is not None:
            handler(data)

    def on_session(self, data: dict[str, Any]) -> None:
        resumed = data.get("resumed")
        if self.session_id and not resumed and self.waiting is not None:
            self.note("(the kernel no longer knows this session: the reply in flight is lost)")
            self.waiting, self.approval, self.streamed = None, None, []
            self.idle.set()
        self.session_id = data.get("session_id")
        if resumed:
            self.note(f"(reconnected: {data.get('replayed', 0)} events replayed)")
        if data.get("gap"):
            self.note("(some events of this session were lost while disconnected)")

    def on_thinking(self, data: dict[str, Any]) -> None:
        """A reasoning model's thinking, on stderr (stdout holds only replies)."""
        text = data.get("text", "")
        if not isinstance(text, str):
            return
        if data.get("fresh") and self.thinking:
            self.err.write("\n")
        self.thinking = True
        self.err.write(visible(text))
        self.err.flush()

    def _thought(self) -> None:
        """End the line of thinking shown, if one is."""
        if self.thinking:
            self.thinking = False
            self.err.write("\n")
            self.err.flush()

    def on_chunk(self, data: dict[str, Any]) -> None:
        self._thought()
        attempt = data.get("attempt", 1)
        if attempt != self.attempt:
            if self.streamed:
                self.write("\n")
                self.note("(that reply was not accepted; the model is asked again)")
            self.attempt, self.streamed = attempt, []
        text = data.get("text", "")
        self.streamed.append(text)
        self.write(visible(text))

    def on_message(self, data: dict[str, Any]) -> None:
        self._thought()
        content = data.get("content", "")
        streamed = "".join(self.streamed)
        if streamed and not data.get("notice") and content == streamed:
            self.write("\n")
        else:
            if streamed:
                self.write("\n")
                self.note("(the streamed text above was not kept; the answer is:)")
            self.write(visible(content) + ("" if content.endswith("\n") else "\n"))
        self.streamed, self.attempt = [], 0
        if data.get("turn_id") is None:
            self.settle(data.get("correlation_id"))

    def on_error(self, data: dict[str, Any]) -> None:
        self._thought()
        if self.streamed:
            self.write("\n")
            self.streamed = []
        wait = data.get("retry_after_seconds")
        after = f" (retry after {wait:g} s)" if isinstance(wait, (int, float)) else ""
        self.note(f"error {data.get('code')}: {visible(str(data.get('message')))}{after}")
        if data.get("turn_id") is None:
            self.settle(data.get("correlation_id"))

    def on_approval(self, data: dict[str, Any]) -> None:
        self.approval = data
        self.write(approval_text(data.get("facts") or {}) + "\nApprove? [y/N] ")
        self.idle.set()

    def on_done(self, data: dict[str, Any]) -> None:
        self._thought()
        if data.get("status") == "aborted":
            if self.streamed:
                self.write("\n")
            self.note("(turn aborted: nothing of it was archived)")
        self.streamed, self.attempt = [], 0
        self.settle(data.get("correlation_id"))

    def on_status(self, data: dict[str, Any]) -> None:
        if data.get("turn_id") is None:
            view = data.get("view") or {}
            self.write(" ".join(f"{k}={visible(str(v))}" for k, v in view.items()) + "\n")
            self.settle(data.get("correlation_id"))

    def settle(self, correlation_id: str | None) -> None:
        """The turn or command the client waits for is over."""
        if correlation_id is not None and correlation_id == self.waiting:
            self.waiting = None
            self.approval = None
            self.idle.set()

    # -- input ------------------------------------------------------------------

    async def chat(self, lines: LineSource) -> None:
        """Send each line when the previous one is answered; answer approvals."""
        while True:
            await self.idle.wait()
            line = await lines.next()
            if line is None or line.strip().lower() in LEAVE:
                return
            if self.approval is not None:
                await self.answer(line)
            elif line.strip():
                await self.say(line)

    async def say(self, line: str) -> None:
        self.serial += 1
        self.waiting = f"c{self.serial}"
        self.idle.clear()
        command = line.strip().startswith("/")
        data = {"content": line.strip() if command else line, "thread": self.thread,
                "correlation_id": self.waiting}
        await self.send("command" if command else "message", data)

    async def answer(self, line: str) -> None:
        approval, self.approval = self.approval or {}, None
        approved = line.strip().lower() in ("y", "yes")
        self.idle.clear()
        await self.send("approve" if approved else "deny",
                        {"approval_id": approval.get("approval_id"),
                         "digest": (approval.get("facts") or {}).get("digest") or None})

    def interrupt(self) -> None:
        """Ctrl-C: abort the turn in flight, or leave."""
        if self.waiting is not None and self.ws is not None:
            asyncio.ensure_future(self.send("abort", {"correlation_id": self.waiting}))
        else:
            self.stopped.set()

    # -- output -----------------------------------------------------------------

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


def approval_text(facts: dict[str, Any]) -> str:
    """An approval's kernel facts as lines; every value made visible."""
    shown = {key: visible(str(value)) for key, value in facts.items()
             if key not in ("argv", "env", "model-note", "digest")}
    lines = [f"Approval needed: {shown.get('title', '?')}"]
    for key, label in (("command", "command"), ("cwd", "directory"), ("target", "to"),
                       ("action", "action")):
        if key in shown:
            lines.append(f"  {label}: {shown[key]}")
    if facts.get("env") is not None and "command" in shown:
        lines.append(f"  environment: {', '.join(map(str, facts['env'])) or '(none)'}")
    if "text" in shown:
        lines += ["  text:", *[f"  | {line}" for line in shown["text"].split("\n")]]
    lines.append(f"  asked by skill {shown.get('skill') or '?'} in {shown.get('thread', '?')}")
    if facts.get("model-note"):
        lines.append(f"  the model says (unverified): “{model_note(str(facts['model-note']))}”")
    return "\n".join(lines)


async def run_client(url: str, token: str, thread: str = DEFAULT_THREAD, *,
                     stdin: TextIO | None = None, out: TextIO | None = None,
                     err: TextIO | None = None) -> int:
    """Chat over the wire at URL until the input ends or /quit; the exit status."""
    client = WireClient(url, token, thread, out=out or sys.stdout, err=err or sys.stderr)
    try:
        await client.connect()
    except WireError as error:
        client.note(f"opencortex client: {error}")
        return EXIT_FAILED
    listener = asyncio.create_task(client.listen())
    chatting = asyncio.create_task(client.chat(LineSource(stdin or sys.stdin)))
    stopping = asyncio.create_task(client.stopped.wait())
    tasks = (listener, chatting, stopping)
    with sigint_calls(client.interrupt):
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    client.leaving = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if client.ws is not None:
        await client.ws.close()
    failure = listener.exception() if listener in done and not listener.cancelled() else None
    if failure is not None:
        client.note(f"opencortex client: {failure}")
        return EXIT_FAILED
    return EXIT_OK


def endpoint(args: argparse.Namespace) -> tuple[str, str]:
    """The URL and token to use, from the options, the environment or the connection file."""
    info: dict[str, Any] = {}
    if args.url is None or not os.environ.get("OPENCORTEX_WS_TOKEN"):
        if args.connection_file is None:
            from opencortex.serve_port import default_connection_file
            args.connection_file = default_connection_file()
        try:
            info = json.loads(Path(args.connection_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise WireError(f"cannot read the connection file {args.connection_file}: "
                            f"{error}; is `opencortex serve --ws PORT` running?") from None
    url = args.url or (f"ws://127.0.0.1:{info['ws_port']}" if "ws_port" in info else None)
    token = os.environ.get("OPENCORTEX_WS_TOKEN") or info.get("ws_token") or info.get("secret")
    if not url or not token:
        raise WireError("the kernel serves no wire (start it with `opencortex serve --ws PORT`)")
    return url, token


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opencortex client", description=(
        "Chat with a running kernel over its WebSocket wire."))
    parser.add_argument("--url", help="ws://127.0.0.1:PORT (default: from the connection file)")
    parser.add_argument("--connection-file", type=Path,
                        help="the kernel's connection file (default: the runtime directory's)")
    parser.add_argument("--thread", default=DEFAULT_THREAD,
                        help=f"the conversation (thread cli:NAME; default {DEFAULT_THREAD})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`opencortex client [--url URL] [--connection-file FILE] [--thread NAME]`."""
    args = build_parser().parse_args(argv)
    try:
        url, token = endpoint(args)
    except WireError as error:
        print(f"opencortex client: {error}", file=sys.stderr)
        return EXIT_FAILED
    return asyncio.run(run_client(url, token, args.thread))


if __name__ == "__main__":
    sys.exit(main())
