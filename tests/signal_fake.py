"""A loopback fake of signal-cli's JSON-RPC daemon, as signal-cli-jsonrpc(5) documents it.

It speaks what `signal-cli -a ACCOUNT daemon --tcp HOST:PORT --receive-mode=manual`
(or `--socket PATH`) speaks: JSON-RPC 2.0, one JSON object per line each way.

- A request `{"jsonrpc":"2.0","method":M,"params":{…},"id":ID}` gets
  `{"jsonrpc":"2.0","result":R,"id":ID}` or `{"jsonrpc":"2.0","error":{"code":C,
  "message":…,"data":…},"id":ID}`.  An empty or non-JSON line gets -32700, a
  wrong version or no method -32600, an unknown method -32601; a command's own
  failure -1 (user error), -4 (untrusted key), -5 (rate limit) as signal-cli's
  `SignalJsonRpcCommandHandler` maps them.
- `subscribeReceive` returns a subscription id (an integer).  Each incoming
  message then goes to the subscribed connections as `{"jsonrpc":"2.0","method":
  "receive","params":{"subscription":N,"result":{"envelope":{…},"account":…}}}`.
  In manual receive mode nothing is received while nobody is subscribed:
  messages wait (on Signal's server) until a client subscribes, and they may
  reach it before the `subscribeReceive` response does.  A connection's
  subscriptions end with it.
- `send` (`recipient` list or `groupId`; `message`, `textStyle`, `editTimestamp`)
  returns `{"timestamp":T,"results":[{"recipientAddress":{…},"type":"SUCCESS"}]}`;
  `sendTyping` and `sendReceipt` return `{}`; `version` returns `{"version":…}`.

Envelopes are shaped like signal-cli's `JsonMessageEnvelope` (source,
sourceNumber, sourceUuid, sourceName, sourceDevice, timestamp,
serverReceivedTimestamp, serverDeliveredTimestamp, dataMessage with timestamp,
message, expiresInSeconds, viewOnce, mentions, attachments, contacts, and when
present groupInfo, quote, reaction, remoteDelete; or editMessage).  People act
through `message` and `react`; faults are `fail` (an error object for a
method's next call), `drop` (every connection closed at once) and
`receive_exception` (a receive notification carrying `exception`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

ACCOUNT = "+15550000001"
ACCOUNT_UUID = "00000000-0000-4000-8000-000000000001"
LIMIT = 16 << 20
_STYLE = re.compile(r"^\d+:\d+:(BOLD|ITALIC|SPOILER|STRIKETHROUGH|MONOSPACE)$")


@dataclass(frozen=True)
class Person:
    uuid: str
    number: str | None
    name: str


@dataclass
class Sent:
    chat_id: str          # the recipient as addressed (UUID or number), or the group id
    text: str
    styles: list[str]
    timestamp: int
    is_group: bool
    edits: list[str] = field(default_factory=list)
    quote: tuple[str, int] | None = None    # (author, timestamp) of the message quoted


# The people and groups of the tests.
OWNER = Person("3f1c2a9e-5b7d-4e60-9a1b-0c2d3e4f5a61", "+15550000010", "Owner")
FRIEND = Person("7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c02", "+15550000020", "Friend")
STRANGER = Person("c0ffee00-0000-4000-8000-00000000dead", "+15550000666", "Stranger")
GROUP = "Pmpi+EfPWmsxiomLe9Nx2XF9HOE483p6iKiFj65iMwI="
OTHER_GROUP = "b3RoZXIgZ3JvdXAgaWQgb2YgMzIgYnl0ZXMgbG9uZyE="


class UserError(Exception):
    """A command failed the way signal-cli reports with code -1."""


@dataclass(eq=False)
class _Client:
    writer: asyncio.StreamWriter
    subscriptions: set[int] = field(default_factory=set)

    def write(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(json.dumps(message).encode() + b"\n")


def rate_limited(seconds: int) -> dict[str, Any]:
    """The error object signal-cli gives when Signal rate-limits a send."""
    return {"code": -5, "message": "Failed to send message due to rate limiting",
            "data": {"response": {"timestamp": 0, "results": [
                {"recipientAddress": {"uuid": None, "number": None, "username": None},
                 "type": "RATE_LIMIT_FAILURE", "retryAfterSeconds": seconds}]}}}


class FakeSignalCli:
    """signal-cli's daemon for one account, on 127.0.0.1 (or a UNIX socket)."""

    def __init__(self, account: str = ACCOUNT, version: str = "0.13.22"):
        self.account = account
        self.version = version
        self.sent: list[Sent] = []
        self.typing: list[tuple[str, bool]] = []
        self.calls: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.on_sent: Any = None          # called with each Sent as it arrives (benchmarks)
        self._clients: set[_Client] = set()
        self._held: list[dict[str, Any]] = []
        self._faults: dict[str, list[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._clock = int(time.time() * 1000)
        self._server: asyncio.AbstractServer | None = None
        self._serving: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, path: str | None = None) -> str:
        """Listen on PATH (a UNIX socket) or a free TCP port; the address to give the bridge."""
        if path is not None:
            self._server = await asyncio.start_unix_server(self._serve, path, limit=LIMIT)
            return path
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=LIMIT)
        return "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, close every connection, and let their handlers end (bounded)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.drop()
        if self._serving:
            await asyncio.wait(self._serving, timeout=5)

    def drop(self) -> None:
        """Close every connection now, as a daemon restart would."""
        for client in list(self._clients):
            client.writer.transport.abort()
        self._clients.clear()

    # -- people ------------------------------------------------------------------

    def message(self, person: Person, text: str | None = None, *, group: str | None = None,
                attachments: list[dict[str, Any]] | None = None, mention_bot: bool = False,
                quote: Sent | None = None, edit_of: int | None = None,
                delete_of: int | None = None, sent: int | None = None) -> int:
        """PERSON sends TEXT (to the bot, or in GROUP); the message's timestamp (SENT:
        this one, in ms, as a message the server kept while the daemon was away)."""
        stamp = self._tick() if sent is None else sent
        data = self._data(stamp, text, group)
        if mention_bot:
            data["message"] = "\ufffc " + (text or "")
            data["mentions"] = [{"name": self.account, "number": self.account,
                                 "uuid": ACCOUNT_UUID, "start": 0, "length": 1}]
        if attachments:
            data["attachments"] = attachments
        if quote is not None:
            data["quote"] = {"id": quote.timestamp, "author": self.account,
                             "authorNumber": self.account, "authorUuid": ACCOUNT_UUID,
                             "text": quote.text, "attachments": []}
        if delete_of is not None:
            data["remoteDelete"] = {"timestamp": delete_of}
        if edit_of is not None:
            self._deliver(self._envelope(person, stamp, editMessage={
                "targetSentTimestamp": edit_of, "dataMessage": data}))
        else:
            self._deliver(self._envelope(person, stamp, dataMessage=data))
        return stamp

    def react(self, person: Person, sent: Sent, emoji: str, *, remove: bool = False) -> None:
        """PERSON reacts with EMOJI on the bot's message SENT."""
        stamp = self._tick()
        data = self._data(stamp, None, sent.chat_id if sent.is_group else None)
        data["reaction"] = {"emoji": emoji, "targetAuthor": self.account,
                            "targetAuthorNumber": self.account, "targetAuthorUuid": ACCOUNT_UUID,
                            "targetSentTimestamp": sent.timestamp, "isRemove": remove}
        self._deliver(self._envelope(person, stamp, dataMessage=data))

    def receive_exception(self, message: str, kind: str) -> None:
        """signal-cli failed on an incoming message: a notification with `exception`."""
        self._deliver_result({"exception": {"message": message, "type": kind},
                              "account": self.account})

    def fail(self, method: str, code: int, message: str = "", data: Any = None,
             error: dict[str, Any] | None = None) -> None:
        """The next call of METHOD gets this error object (faults queue up, in order)."""
        self._faults.setdefault(method, []).append(
            error or {"code": code, "message": message, "data": data})

    def _tick(self) -> int:
        self._clock = max(self._clock + 1, int(time.time() * 1000))
        return self._clock

    def _data(self, stamp: int, text: str | None, group: str | None) -> dict[str, Any]:
        data: dict[str, Any] = {"timestamp": stamp, "message": text, "expiresInSeconds": 0,
                                "viewOnce": False, "mentions": [], "attachments": [],
                                "contacts": []}
        if group is not None:
            data["groupInfo"] = {"groupId": group, "groupName": "Group", "revision": 2,
                                 "type": "DELIVER"}
        return data

    def _envelope(self, person: Person, stamp: int, **content: Any) -> dict[str, Any]:
        return {"source": person.number or person.uuid, "sourceNumber": person.number,
                "sourceUuid": person.uuid, "sourceName": person.name, "sourceDevice": 1,
                "timestamp": stamp, "serverReceivedTimestamp": stamp + 2,
                "serverDeliveredTimestamp": stamp + 4, **content}

    def _deliver(self, envelope: dict[str, Any]) -> None:
        self._deliver_result({"envelope": envelope, "account": self.account})

    def _deliver_result(self, result: dict[str, Any]) -> None:
        """To every subscription; held (as on Signal's server) while there is none."""
        subscribed = [c for c in self._clients if c.subscriptions]
        if not subscribed:
            self._held.append(result)
        for client in subscribed:
            for subscription in client.subscriptions:
                client.write({"jsonrpc": "2.0", "method": "receive",
                              "params": {"subscription": subscription, "result": result}})

    # -- the JSON-RPC daemon -----------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _Client(writer)
        self._clients.add(client)
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
        try:
            while line := await reader.readline():
                answer = self._answer(client, line)
                if answer is not None:
                    client.write(answer)
                    await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            self._clients.discard(client)
            writer.close()

    def _answer(self, client: _Client, line: bytes) -> dict[str, Any] | None:
        if not line.strip():
            return _error(None, -32700, "Empty input line")
        try:
            request = json.loads(line)
        except ValueError as error:
            return _error(None, -32700, f"Unexpected character ({error})")
        if not isinstance(request, dict):
            return _error(None, -32600, f"unexpected type: {type(request).__name__.upper()}")
        ident = request.get("id")
        if request.get("jsonrpc") != "2.0":
            return _error(ident, -32600, "only jsonrpc version 2.0 is supported")
        method = request.get("method")
        if not isinstance(method, str):
            return _error(ident, -32600, "method field must be set")
        self.calls.append(method)
        self.requests.append(request)
        answer = self._run(client, method, dict(request.get("params") or {}), ident)
        return answer if "id" in request else None

    def _run(self, client: _Client, method: str, params: dict[str, Any],
             ident: Any) -> dict[str, Any]:
        params.pop("account", None)    # single-account daemon: the account param is not needed
        if self._faults.get(method):
            return {"jsonrpc": "2.0", "error": self._faults[method].pop(0), "id": ident}
        handler = getattr(self, f"_rpc_{method}", None)
        if handler is None:
            return _error(ident, -32601, "Method not implemented")
        try:
            return {"jsonrpc": "2.0", "result": handler(client, params), "id": ident}
        except UserError as error:
            return _error(ident, -1, str(error))

    def _rpc_version(self, client: _Client, params: dict[str, Any]) -> Any:
        return {"version": self.version}

    def _rpc_subscribeReceive(self, client: _Client, params: dict[str, Any]) -> Any:
        subscription = next(self._ids)
        client.subscriptions.add(subscription)
        held, self._held = self._held, []
        for result in held:   # receiving starts at once: these may overtake the response
            client.write({"jsonrpc": "2.0", "method": "receive",
                          "params": {"subscription": subscription, "result": result}})
        return subscription

    def _rpc_unsubscribeReceive(self, client: _Client, params: dict[str, Any]) -> Any:
        if params.get("subscription") not in client.subscriptions:
            raise UserError("Unknown subscription id")
        client.subscriptions.discard(params["subscription"])
        return {}

    def _rpc_send(self, client: _Client, params: dict[str, Any]) -> Any:
        chats, is_group = _chats(params)
        text = params.get("message") or ""
        styles = params.get("textStyle", params.get("textStyles", []))
        styles = [styles] if isinstance(styles, str) else list(styles)
        for style in styles:
            if not _STYLE.match(style):
                raise UserError(f"Invalid textStyle syntax ({style}) expected "
                                "'start:length:STYLE'")
        if not text and not params.get("attachment") and not params.get("attachments"):
            raise UserError("Sending empty message is not allowed, either a message, "
                            "attachment or sticker must be given.")
        quote = None
        if params.get("quoteTimestamp") is not None:
            if not params.get("quoteAuthor"):
                raise UserError("Quote author parameter is missing")
            quote = (str(params["quoteAuthor"]), int(params["quoteTimestamp"]))
        stamp = self._tick()
        for chat in chats:
            edited = [s for s in self.sent if s.timestamp == params.get("editTimestamp")
                      and s.chat_id == chat]
            if edited:
                edited[0].edits.append(text)
                continue
            sent = Sent(chat, text, styles, stamp, is_group, quote=quote)
            self.sent.append(sent)
            if self.on_sent is not None:
                self.on_sent(sent)
        return {"timestamp": stamp, "results": [_result(chat, is_group) for chat in chats]}

    def _rpc_sendTyping(self, client: _Client, params: dict[str, Any]) -> Any:
        chats, _ = _chats(params)
        self.typing.extend((chat, bool(params.get("stop"))) for chat in chats)
        return {}

    def _rpc_sendReceipt(self, client: _Client, params: dict[str, Any]) -> Any:
        _chats(params)
        return {}


def _chats(params: dict[str, Any]) -> tuple[list[str], bool]:
    """The addressed chats: the recipients, or the group; UserError when there is none."""
    if params.get("groupId"):
        return [str(params["groupId"])], True
    recipients = params.get("recipient", params.get("recipients", []))
    recipients = [recipients] if isinstance(recipients, str) else list(recipients)
    if not recipients:
        raise UserError("No recipients given")
    return [str(r) for r in recipients], False


def _result(chat: str, is_group: bool) -> dict[str, Any]:
    address = {"uuid": None if chat.startswith("+") else chat,
               "number": chat if chat.startswith("+") else None, "username": None}
    result: dict[str, Any] = {"recipientAddress": address, "type": "SUCCESS"}
    if is_group:
        result["groupId"] = chat
    return result


def _error(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": {"code": code, "message": message, "data": None},
            "id": ident}
