"""Signal through signal-cli's JSON-RPC daemon: the platform protocol only.

signal-cli holds the account and runs as a daemon, ideally
`signal-cli -a NUMBER daemon --socket PATH --receive-mode=manual` (or `--tcp
127.0.0.1:7583`); the bridge connects to it (`[bridges.signal] address`) and
speaks signal-cli-jsonrpc(5) through `signal_rpc`:

- each new connection calls `subscribeReceive`; messages then arrive as
  `receive` notifications holding the subscription id and
  `result.envelope.dataMessage`.  With `--receive-mode=manual` signal-cli
  receives nothing while no bridge is connected, so messages wait on Signal's
  server meanwhile.  signal-cli acknowledges messages to the server itself
  (once stored); JSON-RPC has no acknowledgement, so `acknowledge` does nothing.
- a sender is their UUID (`sourceUuid`; numbers change).  A direct chat's id
  is the sender's UUID, a group's its base64 `groupInfo.groupId`.  An `allow`
  entry that is a number matches the envelope's `sourceNumber`, handed on as the
  sender's alias (`Inbound.sender_aliases`: the gate decides), so the kernel only
  ever sees UUIDs.
- replies are `send` with plain text and `textStyle` ranges for the emphasis
  (`signal_text`); typing is `sendTyping`.  An approval is a message whose
  reactions ✅/👍 (approve) and ❌/👎 (deny), and replies quoting it that say
  approve/deny, become a `Decision`; its outcome is an edit of that message
  (`send` with `editTimestamp`).  Envelopes are read by `signal_envelope`.
- the connection is made on first use and remade after it drops: a lost
  connection is a BridgeError from `fetch`, and the bridge retries with backoff.
  JSON-RPC error objects become BridgeError with signal-cli's reason, rate
  limits RetryAfter, refused styles FormattingRejected.  When Signal's servers
  refuse this signal-cli as too old, the error says to update signal-cli.

Positions: signal-cli numbers nothing, so a message's position is the time
Signal's server received it (`serverReceivedTimestamp`, in microseconds), made
strictly increasing within a run: the inbox skips positions at or below the
last it kept, and the server's clock is the one that only moves forward.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from opencortex.bridges.approvals import parse_answer
from opencortex.bridges.contract import (BridgeError, Decision, FormattingRejected, Platform,
                                         Unreadable, remember)
from opencortex.bridges.inbound import Inbound, from_milliseconds
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.settings import SignalSettings
from opencortex.bridges.signal_envelope import (addresses, data_message, kind_of,
                                                reaction_answer, text_of)
from opencortex.bridges.signal_rpc import ConnectionLost, RpcConnection, RpcError
from opencortex.bridges.signal_text import styled

log = logging.getLogger(__name__)

APPROVAL_HINT = "React \u2705 or \U0001F44D to approve, \u274C or \U0001F44E to deny, " \
                "or reply to this message with approve / deny."
TOO_OLD = ("Signal's servers refuse this signal-cli as too old: update signal-cli to its "
           "latest release and restart the daemon")
_TOO_OLD_SIGNS = ("too old", "deprecatedversion", "please update")
_RECIPIENT = re.compile(r"^([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|\+[0-9]+"
                        r"|PNI:.+|u:.+)$")
_NUMBERS = re.compile(r"\+[0-9]{5,}")       # phone numbers, kept out of errors and logs
MAX_APPROVALS = 1000     # approval messages remembered for reactions


def looks_too_old(text: str) -> bool:
    """Whether signal-cli's error TEXT says Signal refuses its version."""
    lowered = text.lower()
    return any(sign in lowered for sign in _TOO_OLD_SIGNS)


def target(chat_id: str) -> dict[str, Any]:
    """`send` parameters addressing CHAT_ID: a person (UUID, number) or a group id."""
    return {"recipient": [chat_id]} if _RECIPIENT.match(chat_id) else {"groupId": chat_id}


def answering(chat_id: str, message_id: str | None) -> dict[str, Any]:
    """`send` parameters for an answer in CHAT_ID to the message MESSAGE_ID: in a group,
    it quotes that message (see `quoting`); to one person, nothing."""
    return quoting(message_id) if "groupId" in target(chat_id) else {}


def quoting(message_id: str | None) -> dict[str, Any]:
    """`send` parameters quoting the person's message MESSAGE_ID ("AUTHOR:TIMESTAMP", as
    an incoming message is named); none for another id.  Signal finds the quoted
    message by its author and time; signal-cli leaves its text empty, and a
    Signal app shows its own copy."""
    author, _, stamp = (message_id or "").rpartition(":")
    if not (_RECIPIENT.match(author) and stamp.isascii() and stamp.isdigit()
            and len(stamp) < 19):
        return {}
    return {"quoteTimestamp": int(stamp), "quoteAuthor": author}


class SignalPlatform(Platform):
    """One Signal account, through its signal-cli daemon."""

    channel = "signal"
    text_limit = 2000     # Signal shows about 2000 characters before "read more"
    per_chat = 1.0
    per_second = 10.0

    def __init__(self, settings: SignalSettings):
        self.settings = settings
        self.account = settings.account     # learned from notifications when not configured
        self.version = ""
        self._connection: RpcConnection | None = None
        self._subscribed: RpcConnection | None = None
        self._connecting = asyncio.Lock()
        self._approvals: dict[tuple[str, int], tuple[str, str]] = {}
        self._position = 0
        self._deferred: BridgeError | None = None   # reported by the next fetch
        self._unreadable = Unreadable("signal")

    # -- the connection ---------------------------------------------------------

    async def _connected(self) -> RpcConnection:
        async with self._connecting:
            if self._connection is None or self._connection.closed:
                try:
                    self._connection = await RpcConnection.open(
                        self.settings.address, self.settings.connect_timeout)
                except ConnectionLost as lost:
                    raise BridgeError(
                        f"cannot reach the signal-cli daemon: {lost}; start it with "
                        "`signal-cli -a NUMBER daemon --socket PATH --receive-mode=manual` "
                        "(or --tcp HOST:PORT); if it exits at once, read its output "
                        "(\"too old\" there means: update signal-cli)") from None
            return self._connection

    async def _call(self, method: str, params: dict[str, Any] | None = None,
                    timeout: float | None = None) -> Any:
        """METHOD's result, every failure as the contract's exception."""
        connection = await self._connected()
        if self.settings.account:
            params = {"account": self.settings.account, **(params or {})}
        try:
            return await connection.call(method, params,
                                         timeout or self.settings.call_timeout)
        except ConnectionLost as lost:
            raise BridgeError(f"lost the connection to signal-cli at {connection.where} "
                              f"({lost}); reconnecting") from None
        except TimeoutError:
            raise BridgeError(f"signal-cli did not answer {method} within "
                              f"{timeout or self.settings.call_timeout:g} s") from None
        except RpcError as error:
            raise self._failure(error) from None

    def _failure(self, error: RpcError) -> Exception:
        """The contract's exception for signal-cli's JSON-RPC error object."""
        reason = _NUMBERS.sub("<number>", " ".join(error.message.split()))[:200]
        if looks_too_old(error.message):
            self._deferred = BridgeError(TOO_OLD, fatal=True)
            return self._deferred
        if error.code == -5:
            return RetryAfter(_retry_after(error.data))
        if error.code == -1 and reason.startswith(("Invalid textStyle", "Invalid style")):
            return FormattingRejected(reason)
        if error.code == -4:
            return BridgeError("signal-cli did not send: a recipient's safety number changed; "
                               "check it, then `signal-cli -a NUMBER trust` it (error -4)")
        if error.code == -32601:
            return BridgeError(f"signal-cli has no method {error.method}; update signal-cli",
                               fatal=True)
        if error.code == -32602 and "account" in reason.lower():
            return BridgeError(f"signal-cli refused {error.method}: {reason}; set "
                               "[bridges.signal] account to the bot's number", fatal=True)
        failed = ", ".join(_failure_types(error.data))
        return BridgeError(f"signal-cli refused {error.method}: {reason}"
                           f"{f' ({failed})' if failed else ''} (JSON-RPC error {error.code})")

    async def _subscription(self) -> RpcConnection:
        """The connection, subscribed to incoming messages (once per connection)."""
        connection = await self._connected()
        if self._subscribed is not connection:
            await self._call("subscribeReceive")
            self._subscribed = connection
        return connection

    # -- the contract -----------------------------------------------------------

    async def start(self) -> str:
        found = await self._call("version", timeout=self.settings.connect_timeout)
        self.version = str(found.get("version", "")) if isinstance(found, dict) else ""
        return self.account or f"signal-cli {self.version or '(unknown version)'}"

    async def fetch(self) -> list[Inbound | Decision]:
        self._raise_deferred()
        try:
            connection = await self._subscription()
        except BridgeError:
            self._deferred = None        # reported now by this fetch: not a second time
            raise
        try:
            notes = await connection.notifications(self.settings.poll_timeout)
        except ConnectionLost as lost:
            raise BridgeError(f"lost the connection to signal-cli at {connection.where} "
                              f"({lost}); reconnecting") from None
        items: list[Inbound | Decision] = []
        for number, note in enumerate(notes, 1):
            with self._unreadable.skipped(f"notification {number} of {len(notes)}"):
                item = self._item(note)
                if item is not None:
                    items.append(item)
        if not items:
            self._raise_deferred()
        return items

    async def acknowledge(self) -> None:
        """Nothing to do: signal-cli acknowledged the messages to Signal when it stored them."""

    async def send(self, chat_id: str, html: str, plain: str, key: str | None = None,
                   reply_to: str | None = None) -> None:
        # signal-cli's send has no idempotency key: KEY cannot be used
        text, styles = styled(html) if html else (plain, [])
        if not text.strip():
            log.info("signal: an empty message was not sent")
            return
        params = {**target(chat_id), "message": text, **answering(chat_id, reply_to)}
        if styles:
            params["textStyle"] = styles
        await self._call("send", params)

    async def typing(self, chat_id: str) -> None:
        await self._call("sendTyping", target(chat_id))

    async def show_approval(self, chat_id: str, text: str, approval_id: str,
                            digest: str, reply_to: str | None = None) -> Any:
        message = f"{text}\n\n{APPROVAL_HINT}"
        sent = await self._call("send", {**target(chat_id), "message": message,
                                         **answering(chat_id, reply_to)})
        timestamp = int(sent["timestamp"]) if isinstance(sent, dict) else 0
        remember(self._approvals, (chat_id, timestamp), (approval_id, digest), MAX_APPROVALS)
        return timestamp, message

    async def settle_approval(self, chat_id: str, handle: Any, outcome: str) -> None:
        timestamp, message = handle
        self._approvals.pop((chat_id, timestamp), None)
        await self._call("send", {**target(chat_id), "message": f"{message}\n\n{outcome}",
                                  "editTimestamp": timestamp})

    async def answer_decision(self, decision: Decision, text: str) -> None:
        await self._call("send", {**target(decision.chat_id), "message": text})

    async def stop(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    # -- notifications ----------------------------------------------------------

    def _raise_deferred(self) -> None:
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error

    def _item(self, note: dict[str, Any]) -> Inbound | Decision | None:
        """A `receive` notification of our subscription as an Inbound or a Decision."""
        params = note.get("params")
        if note.get("method") != "receive" or not isinstance(params, dict) \
                or "subscription" not in params:   # unwrapped: the daemon's own receive mode
            return None
        result = params.get("result")
        if not isinstance(result, dict):
            return None
        if not self.account and isinstance(result.get("account"), str):
            self.account = result["account"]
        exception = result.get("exception")
        if isinstance(exception, dict):
            self._exception(exception)
        envelope = result.get("envelope")
        return self._from_envelope(envelope) if isinstance(envelope, dict) else None

    def _exception(self, exception: dict[str, Any]) -> None:
        """signal-cli could not take a message: report a too-old client, log the rest."""
        kind = str(exception.get("type") or "error")
        if looks_too_old(f"{kind} {exception.get('message') or ''}"):
            self._deferred = BridgeError(TOO_OLD, fatal=True)
        else:
            log.warning("signal: signal-cli could not read an incoming message (%s)", kind)

    def _from_envelope(self, envelope: dict[str, Any]) -> Inbound | Decision | None:
        """A person's data message as an Inbound, or a Decision on a shown approval."""
        found = data_message(envelope)
        if found is None or (self.account and envelope.get("sourceNumber") == self.account):
            return None        # receipts, typing, sync and call messages, our own
        sender, data, kind = found
        group = data.get("groupInfo") if isinstance(data.get("groupInfo"), dict) else {}
        chat = str(group.get("groupId") or sender)
        if isinstance(data.get("reaction"), dict):
            return self._reaction(chat, sender, data["reaction"])
        answer = self._quoted_answer(chat, sender, data)
        if answer is not None:
            return answer
        if data.get("isExpirationUpdate") or (group.get("type") == "UPDATE"
                                              and data.get("message") is None):
            return None
        number = envelope.get("sourceNumber")
        stamp = data.get("timestamp") or envelope.get("timestamp")
        return Inbound(position=self._next_position(envelope), chat_id=chat, sender_id=sender,
                       message_id=f"{sender}:{stamp}", text=text_of(data, self.account),
                       kind=kind or kind_of(data),  # type: ignore[arg-type]
                       is_group=bool(group),
                       addressed_to_bot=bool(group) and addresses(data, self.account),
                       sender_name=str(envelope.get("sourceName") or ""),
                       sender_aliases=(number,) if isinstance(number, str) and number else (),
                       sent_at=from_milliseconds(stamp))

    def _reaction(self, chat: str, sender: str, reaction: dict[str, Any]) -> Decision | None:
        """A reaction on a shown approval as a Decision (every other reaction: nothing)."""
        when = reaction.get("targetSentTimestamp")
        shown = self._approvals.get((chat, when)) if isinstance(when, int) else None
        author = reaction.get("targetAuthorNumber")
        if shown is None or reaction.get("isRemove") or \
                (self.account and author and author != self.account):
            return None
        approve = reaction_answer(str(reaction.get("emoji") or ""))
        return None if approve is None else self._decision(chat, sender, shown, approve)

    def _quoted_answer(self, chat: str, sender: str, data: dict[str, Any]) -> Decision | None:
        """A reply quoting a shown approval and saying approve/deny, as a Decision."""
        quote = data.get("quote") if isinstance(data.get("quote"), dict) else {}
        when = quote.get("id")
        shown = self._approvals.get((chat, when)) if isinstance(when, int) else None
        approve = parse_answer(text_of(data, self.account)) if shown is not None else None
        return None if approve is None else self._decision(chat, sender, shown, approve)

    def _decision(self, chat: str, sender: str, shown: tuple[str, str],
                  approve: bool) -> Decision:
        return Decision(position=self._next_position({}), chat_id=chat, sender_id=sender,
                        approval_id=shown[0], digest=shown[1], approve=approve)

    def _next_position(self, envelope: dict[str, Any]) -> int:
        """The server's receive time in µs (local time if absent), strictly increasing."""
        received = envelope.get("serverReceivedTimestamp")
        stamp = received * 1000 if isinstance(received, int) and received > 0 \
            else time.time_ns() // 1000
        self._position = max(stamp, self._position + 1)
        return self._position


def _results(data: Any) -> list[dict[str, Any]]:
    """The per-recipient send results an error object's `data.response` carries."""
    response = data.get("response") if isinstance(data, dict) else None
    results = response.get("results") if isinstance(response, dict) else None
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []


def _retry_after(data: Any) -> float:
    """The longest `retryAfterSeconds` in a rate-limit error's results (10 s if none)."""
    waits = [r.get("retryAfterSeconds") for r in _results(data)]
    return float(max([w for w in waits if isinstance(w, (int, float))], default=10))


def _failure_types(data: Any) -> list[str]:
    """The distinct failure kinds (UNREGISTERED_FAILURE, …) of a failed send's results."""
    kinds = [str(r.get("type")) for r in _results(data) if r.get("type") != "SUCCESS"]
    return sorted(set(kinds))
