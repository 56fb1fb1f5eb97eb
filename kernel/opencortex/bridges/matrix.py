"""Matrix through matrix-nio, with end-to-end encryption (vodozemac): the platform protocol only.

The connection — login, sync, keys, device trust, sending — is `matrix_session`;
this module maps it onto the bridge contract:

- `fetch` returns the new messages of joined rooms (on the very first start,
  none: that initial sync's timeline is old history) and joins the rooms
  allowed users (`allow`, `approvers`) invite the bot to, declining other
  invites.  `acknowledge` keeps the sync position, only after the bridge kept
  the messages; each event has one integer bridge position (`matrix_state`),
  the same one when a sync from an older position brings it again.
- Each room is one chat (`matrix:!room:server`); a reply goes to the thread of
  the message it answers (a notice: to the thread its person last wrote in).
  Messages carry HTML (`org.matrix.custom.html`) and a plain body; typing
  notices while a turn runs.
- Approvals: a message the bot reacts to with ✅ and ❌; a person's ✅/❌
  reaction becomes a `Decision` (replies "approve"/"deny" are the shared
  bridge's); the message is edited to its outcome.
- A message the bot cannot decrypt: a key request (the bot's own devices and
  the sender's), a retry once a key comes, and a short notice to the allowed
  sender in the room, never silence.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

from opencortex.bridges.contract import (BridgeError, Decision, Platform, Unreadable,
                                         remember)
from opencortex.bridges.inbound import Inbound, from_milliseconds
from opencortex.bridges.matrix_crypto import Undecrypted
from opencortex.bridges.matrix_events import (RoomEvent, reaction_answer, read_event,
                                              thread_root)
from opencortex.bridges.matrix_session import MatrixSession
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.settings import MatrixSettings

log = logging.getLogger(__name__)

REMEMBERED = 1000         # events of the bot's, and people's thread roots, remembered

TYPING_MS = 6000         # the bridge repeats the typing notice every 4 s
NOTICE_EVERY = 600.0     # seconds between two equal notices to one sender in one room
HTML = "org.matrix.custom.html"
APPROVAL_HINT = "React ✅ to approve or ❌ to deny (or reply approve / deny)."
UNDECRYPTABLE = ("I could not decrypt your message (I have no key for it yet) and asked "
                 "your devices for the key. If I do not answer, send it again.")
UNTRUSTED = ("Your message came from a device this assistant does not trust; write from "
             "a verified device (see [bridges.matrix] verified_devices).")
ENCRYPTED_ONLY = ("This assistant reads only end-to-end encrypted messages from verified "
                  "devices; turn on encryption in this room.")
_PRE = re.compile(r"(<pre>.*?</pre>)", re.DOTALL)


def matrix_html(html: str) -> str:
    """The bridge's HTML for Matrix, where a newline is only a space: line breaks as
    <br/> except inside <pre>."""
    return "".join(part if part.startswith("<pre>") else part.replace("\n", "<br/>")
                   for part in _PRE.split(html))


def require_nio() -> None:
    """BridgeError (fatal) unless matrix-nio with its encryption support is installed."""
    try:
        from nio.crypto import ENCRYPTION_ENABLED
    except ImportError:
        ENCRYPTION_ENABLED = False
    if not ENCRYPTION_ENABLED:
        raise BridgeError("the Matrix bridge needs matrix-nio with end-to-end encryption: "
                          "pip install 'opencortex-kernel[matrix]' (in a checkout: "
                          "bash kernel/install.sh matrix)", fatal=True)


class MatrixPlatform(Platform):
    """One Matrix account, as the bridge sees it."""

    channel = "matrix"
    text_limit = 4000     # a whole event (HTML, plain, encryption) stays under 64 KiB
    per_chat = 0.2
    per_second = 5.0      # homeservers limit a user's messages; M_LIMIT_EXCEEDED is honoured

    def __init__(self, settings: MatrixSettings, secret: str, state_dir: Path, *,
                 password: bool):
        self.settings = settings
        self._credentials = (secret, state_dir, password)
        self.session: MatrixSession | None = None
        self.undecrypted: Undecrypted | None = None
        self._token = ""          # the sync position acknowledged (kept in the state)
        self._fetched = ""        # the sync position of the last fetch
        self._threads: dict[str, tuple[str, str]] = {}   # room -> (thread root, last event)
        self._roots: dict[str, str] = {}     # a person's event -> its thread root ("": none)
        self._mine: dict[str, None] = {}                  # events the bot sent (newest last)
        self._approvals: dict[str, tuple[str, str]] = {}  # event -> (approval id, digest)
        self._noticed: dict[tuple[str, str, str], float] = {}
        self._typing: set[str] = set()
        self._unreadable = Unreadable("matrix")

    @property
    def client(self) -> Any:
        """matrix-nio's AsyncClient (once started)."""
        return self.session.client if self.session else None

    # -- receiving ------------------------------------------------------------------

    async def start(self) -> str:
        if self.session is None:
            require_nio()
            secret, state_dir, password = self._credentials
            self.session = MatrixSession(self.settings, secret, state_dir, password=password)
            self.undecrypted = Undecrypted(self.session.client)
        await self.session.login()
        self._token = self.session.state.get("next_batch")
        return self.session.user_id

    async def fetch(self) -> list[Inbound | Decision]:
        session = self.session
        await session.login()                  # again, if the server dropped the login
        await session.ready(self._token)
        since = self._token
        response = session.take_first() or await session.sync(since)
        await session.housekeeping()
        await self._invites(response)
        events = await session.timeline(response, since) if since else []   # first: history
        items = await self._items(events + self.undecrypted.retry())
        self._fetched = response.next_batch
        return items

    async def acknowledge(self) -> None:
        if self._fetched and self._fetched != self._token:
            self._token = self._fetched      # kept (fsynced) off the event loop
            await asyncio.to_thread(self.session.state.put, next_batch=self._token)

    async def _invites(self, response: Any) -> None:
        """Join the rooms allowed users invite the bot to; decline every other invite."""
        for room_id in response.rooms.invite:
            room = self.client.invited_rooms.get(room_id)
            inviter = room.inviter if room is not None else None
            if inviter in self.session.trust.people:
                await self.session.call("join", self.client.join(room_id))
                log.info("matrix: joined %s on the invite of %s", room_id, inviter)
            else:
                await self.session.call("decline", self.client.room_leave(room_id))
                self.client.invited_rooms.pop(room_id, None)
                log.info("matrix: declined the invite to %s from %s", room_id, inviter)

    async def _items(self, events: list[tuple[str, Any]]) -> list[Inbound | Decision]:
        """EVENTS as the contract's messages and decisions, each with its bridge position."""
        from nio import MegolmEvent
        read: list[tuple[str, Any, RoomEvent]] = []
        for room_id, event in events:
            with self._unreadable.skipped(f"event {getattr(event, 'event_id', '?')}"):
                if isinstance(event, MegolmEvent):
                    if event.sender != self.session.user_id:
                        await self._undecryptable(room_id, event)
                    continue
                seen = read_event(event.source)    # any JSON: nio's BadEvents too
                if seen is not None and seen.sender != self.session.user_id:
                    read.append((room_id, event, seen))
        positions, before = await asyncio.to_thread(     # kept (fsynced) off the event loop
            self.session.state.positions, [seen.event_id for *_, seen in read])
        items: list[Inbound | Decision] = []
        for room_id, event, seen in read:
            if seen.kind == "reaction" and seen.event_id in before:
                continue     # a decision is never applied twice
            with self._unreadable.skipped(f"event {seen.event_id}"):
                item = await self._item(room_id, event, seen, positions[seen.event_id])
                if item is not None:
                    items.append(item)
        return items

    async def _item(self, room_id: str, event: Any, seen: RoomEvent,
                    position: int) -> Inbound | Decision | None:
        if not self.session.trust.sender_trusted(event, room_id):
            log.info("matrix: event %s from an untrusted device ignored", seen.event_id)
            encrypted = getattr(event, "decrypted", False)
            await self._notice(room_id, seen.sender, UNTRUSTED if encrypted else ENCRYPTED_ONLY)
            return None
        if seen.kind == "reaction":
            return self._decision(room_id, seen, position)
        if seen.sender in self.session.trust.people and seen.kind in ("text", "media"):
            self._threads[room_id] = (seen.thread_root, seen.event_id)
            remember(self._roots, seen.event_id, seen.thread_root, REMEMBERED)
        room = self.client.rooms.get(room_id)
        stamp = getattr(event, "server_timestamp", None)      # the sender's server's
        return Inbound(position=position, chat_id=room_id, sender_id=seen.sender,
                       message_id=seen.event_id, text=seen.text, kind=seen.kind,  # type: ignore
                       is_group=room is not None and room.member_count > 2,
                       addressed_to_bot=self._addressed(room, seen),
                       sender_name=(room.user_name(seen.sender) or "") if room else "",
                       sent_at=from_milliseconds(stamp))

    def _decision(self, room_id: str, seen: RoomEvent, position: int) -> Decision | None:
        bound = self._approvals.get(seen.reacts_to)
        answer = reaction_answer(seen.reaction)
        if bound is None or answer is None:
            return None
        return Decision(position=position, chat_id=room_id, sender_id=seen.sender,
                        approval_id=bound[0], digest=bound[1], approve=answer,
                        token=seen.event_id)

    def _addressed(self, room: Any, seen: RoomEvent) -> bool:
        """In a group: does the message mention the bot or reply to one of its messages?"""
        me = self.session.user_id
        if me in seen.mentions or seen.reply_to in self._mine:
            return True
        names = {me, me[1:].partition(":")[0]}
        if room is not None and room.user_name(me):
            names.add(room.user_name(me))
        return any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", seen.text, re.IGNORECASE)
                   for name in names if name)

    async def _undecryptable(self, room_id: str, event: Any) -> None:
        """For an allowed sender: ask for the missing key (once per session), keep the event
        for a retry, and tell them.  A stranger's is only logged."""
        log.info("matrix: could not decrypt event %s in %s", event.event_id, room_id)
        if event.sender not in self.session.trust.people:
            return
        event.room_id = room_id
        if self.undecrypted.keep(event):
            request = event.as_key_request(event.sender, self.client.device_id,
                                           device_id=event.device_id)
            try:
                await self.session.call("key request", self.client.request_room_key(event))
                await self.session.call("key request", self.client.to_device(request))
            except (BridgeError, RetryAfter) as error:
                log.info("matrix: key request for %s: %s", event.event_id, error)
        await self._notice(room_id, event.sender, UNDECRYPTABLE)

    async def _notice(self, room_id: str, sender: str, text: str) -> None:
        """Tell an allowed SENDER something about their message (rarely; never raises)."""
        if sender not in self.session.trust.people:
            return
        now, key = time.monotonic(), (room_id, sender, text)
        if now - self._noticed.get(key, -NOTICE_EVERY) < NOTICE_EVERY:
            return
        self._noticed = {k: at for k, at in self._noticed.items() if now - at < NOTICE_EVERY}
        self._noticed[key] = now
        try:
            await self._post(room_id, {"msgtype": "m.notice", "body": text})
        except (BridgeError, RetryAfter) as error:
            log.info("matrix: a notice in %s was not sent: %s", room_id, error)

    # -- sending --------------------------------------------------------------------

    async def send(self, chat_id: str, html: str, plain: str, key: str | None = None,
                   reply_to: str | None = None) -> None:
        content: dict[str, Any] = {"msgtype": "m.text", "body": plain}
        if html:
            content.update(format=HTML, formatted_body=matrix_html(html))
        await self._post(chat_id, content, key, reply_to)

    async def _post(self, room_id: str, content: dict[str, Any], key: str | None = None,
                    reply_to: str | None = None) -> str:
        """Send a message to ROOM_ID, in the thread of the message REPLY_TO (without one:
        the thread its person last wrote in); its event id.  KEY: see `Platform.send`
        (the homeserver keeps a transaction id's event)."""
        await self.session.ready(self._token)
        if reply_to:
            root, last = await self._thread_of(room_id, reply_to), reply_to
        else:
            root, last = self._threads.get(room_id, ("", ""))
        if root:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": root,
                                       "is_falling_back": True,
                                       "m.in_reply_to": {"event_id": last}}
        event_id = await self._send_event(room_id, "m.room.message", content, key)
        if root and not reply_to:
            self._threads[room_id] = (root, event_id)
        if room_id in self._typing:
            self._typing.discard(room_id)
            try:
                await self.session.call("typing", self.client.room_typing(room_id, False))
            except (BridgeError, RetryAfter):
                pass
        return event_id

    async def _send_event(self, room_id: str, kind: str, content: dict[str, Any],
                          key: str | None = None) -> str:
        """Send one event and remember it as the bot's (for replies to the bot)."""
        event_id = await self.session.send(room_id, kind, content, key)
        remember(self._mine, event_id, None, REMEMBERED)
        return event_id

    async def _thread_of(self, room_id: str, event_id: str) -> str:
        """The thread root of a person's message EVENT_ID in ROOM_ID ("": none): as it was
        read, or (read before a restart) as the homeserver has it; "" if it cannot say."""
        root = self._roots.get(event_id)
        if root is None:
            try:
                answer = await self.session.call(
                    "getEvent", self.client.room_get_event(room_id, event_id))
            except (BridgeError, RetryAfter):
                return ""
            root = thread_root(getattr(getattr(answer, "event", None), "source", None))
            remember(self._roots, event_id, root, REMEMBERED)
        return root

    async def typing(self, chat_id: str) -> None:
        await self.session.ready(self._token)
        await self.session.call("typing", self.client.room_typing(chat_id, True,
                                                                  timeout=TYPING_MS))
        self._typing.add(chat_id)

    async def show_approval(self, chat_id: str, text: str, approval_id: str,
                            digest: str, reply_to: str | None = None) -> Any:
        event_id = await self._post(chat_id, {"msgtype": "m.text",
                                              "body": f"{text}\n\n{APPROVAL_HINT}"},
                                    reply_to=reply_to)
        self._approvals[event_id] = (approval_id, digest)
        reactions = []
        for key in ("✅", "❌"):   # the person taps one of these
            relation = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
            try:
                reactions.append(await self._send_event(chat_id, "m.reaction",
                                                        {"m.relates_to": relation}))
            except (BridgeError, RetryAfter) as error:
                log.info("matrix: approval reaction not shown: %s", error)
        return event_id, text, reactions

    async def settle_approval(self, chat_id: str, handle: Any, outcome: str) -> None:
        event_id, text, reactions = handle
        self._approvals.pop(event_id, None)
        body = f"{text}\n\n{outcome}"
        await self._send_event(chat_id, "m.room.message", {
            "msgtype": "m.text", "body": f"* {body}",
            "m.new_content": {"msgtype": "m.text", "body": body},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}})
        for reaction in reactions:
            try:
                await self.session.call("redact", self.client.room_redact(chat_id, reaction))
            except (BridgeError, RetryAfter) as error:
                log.info("matrix: approval reaction not removed: %s", error)

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
