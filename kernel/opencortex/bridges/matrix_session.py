"""One Matrix account's connection through matrix-nio: login, sync, keys, sending.

- Login: the access token the platform is given (checked with whoami), or a
  password.  A password login's token and device id are kept (`matrix_state`),
  so a restart is the same login and device, whose crypto keys matrix-nio keeps
  in `STATE/crypto/` (0700); a kept token the server no longer accepts is
  dropped and the password used again.
- Sync: `ready` makes the run's first /sync with the rooms' full state (a room
  must be known to encrypt for its members) from the given position; `timeline`
  completes a timeline the server cut short ("limited") with /messages back to
  that position, and drops the history of a room from before the bot's invite.
- Keys after every sync (`housekeeping`): upload ours, learn the devices in
  encrypted rooms and settle their trust (`matrix_crypto.DeviceTrust`), send
  queued to-device messages.  `send` encrypts for trusted devices only.

Every request goes through `call`: an error response becomes the contract's
`BridgeError` (its code only, never content) or `RetryAfter` (M_LIMIT_EXCEEDED,
whose wait matrix-nio is told not to do itself).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from opencortex.bridges.contract import BridgeError
from opencortex.bridges.matrix_crypto import DeviceTrust
from opencortex.bridges.matrix_events import nested
from opencortex.bridges.matrix_state import MatrixState, private_directory
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.settings import MatrixSettings

log = logging.getLogger(__name__)

logging.getLogger("nio").setLevel(logging.WARNING)
logging.getLogger("peewee").setLevel(logging.WARNING)   # nio's store: SQL with key pickles
for _name in ("nio.events", "nio.responses"):   # their validation warnings quote content
    logging.getLogger(_name).setLevel(logging.CRITICAL)

TIMELINE_LIMIT = 50      # events per room in one sync; a longer gap is paged in
BACKFILL_PAGES = 20      # of 100 events, at most, to complete one room's limited timeline
REQUEST_TIMEOUT = 60.0   # seconds for one request other than /sync
SYNC_FILTER = {"room": {"timeline": {"limit": TIMELINE_LIMIT},
                        "ephemeral": {"not_types": ["*"]},
                        "account_data": {"not_types": ["*"]}},
               "presence": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]}}


def transaction_id(key: str | None) -> str | None:
    """The Matrix transaction id of a message named KEY (None: a new one each send)."""
    if key is None:
        return None
    return "oc-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


class MatrixSession:
    """The nio client of one account, its kept state and its device trust."""

    def __init__(self, settings: MatrixSettings, secret: str, state_dir: Path, *,
                 password: bool):
        from nio import AsyncClient, AsyncClientConfig
        self.settings = settings
        self._secret = secret
        self._password = password
        self.state = MatrixState(state_dir)
        store = private_directory(state_dir / "crypto")
        config = AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0,
                                   store_sync_tokens=False, encryption_enabled=True,
                                   request_timeout=REQUEST_TIMEOUT)
        self.client = AsyncClient(settings.homeserver, settings.user_id,
                                  store_path=str(store), config=config)
        self.trust = DeviceTrust(settings, self.client)
        self.first: Any = None    # the run's first sync, until the first fetch takes it
        self._started = False
        self._ready_lock = asyncio.Lock()
        self._keys_lock = asyncio.Lock()   # fetch and sends both do the key work

    @property
    def user_id(self) -> str:
        return self.client.user_id

    # -- requests -----------------------------------------------------------------

    async def call(self, doing: str, request: Awaitable[Any]) -> Any:
        """Await a matrix-nio request; its error response or failure as the contract's."""
        import aiohttp
        from nio import ErrorResponse, LocalProtocolError
        try:
            answer = await request
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as error:
            raise BridgeError(f"Matrix {doing}: the homeserver did not answer "
                              f"({type(error).__name__})") from None
        except LocalProtocolError as error:
            raise BridgeError(f"Matrix {doing} failed ({error})") from None
        if isinstance(answer, ErrorResponse):
            raise self._failure(answer, doing)
        return answer

    def _failure(self, answer: Any, doing: str) -> Exception:
        """The contract's exception for an error response (its code only, no content)."""
        code = answer.status_code or ""
        status = getattr(answer.transport_response, "status", 0)
        if code == "M_LIMIT_EXCEEDED" or status == 429:
            return RetryAfter((answer.retry_after_ms or 5000) / 1000)
        if code == "M_UNKNOWN_TOKEN":
            self.client.access_token = ""    # a password login is redone by `login`
            return BridgeError(f"Matrix {doing}: the homeserver no longer accepts the access "
                               f"token; set a new one, or a password", fatal=not self._password)
        if doing == "login":
            return BridgeError(f"Matrix refused the login of {self.settings.user_id} ({code}); "
                               f"check the password in ${self.settings.password_env}",
                               fatal=True)
        return BridgeError(f"Matrix {doing} failed ({code or f'HTTP {status}'})")

    # -- login --------------------------------------------------------------------

    async def login(self) -> None:
        """Log in unless logged in: the given token, else the kept token, else the password."""
        if self.client.access_token:
            return
        if not self._password:
            await self._use_token(self._secret, kept=False)
            return
        kept = self.state.get("access_token")
        if kept and self.state.get("user_id") == self.settings.user_id and \
                await self._use_token(kept, kept=True):
            return
        self.client.device_id = self.settings.device_id or self.state.get("device_id") or None
        answer = await self.call("login", self.client.login(
            self._secret, device_name=self.settings.device_name))
        self.state.put(user_id=answer.user_id, device_id=answer.device_id,
                       access_token=answer.access_token)
        log.info("matrix: logged in as %s, device %s", answer.user_id, answer.device_id)

    async def _use_token(self, token: str, kept: bool) -> bool:
        """Log in with TOKEN (checked with whoami); False if a KEPT token is no longer valid."""
        self.client.access_token = token
        try:
            answer = await self.call("whoami", self.client.whoami())
        except (BridgeError, RetryAfter):
            revoked, self.client.access_token = not self.client.access_token, ""
            if not (kept and revoked):
                raise
            self.state.put(access_token="")
            return False
        self.client.access_token = ""
        device = answer.device_id or self.settings.device_id or self.state.get("device_id")
        if answer.user_id != self.settings.user_id:
            raise BridgeError(f"the Matrix access token is not {self.settings.user_id}'s",
                              fatal=True)
        if not device or (self.settings.device_id and device != self.settings.device_id):
            raise BridgeError("the Matrix access token's device is not [bridges.matrix] "
                              "device_id; set device_id to the token's device", fatal=True)
        self.client.restore_login(answer.user_id, device, token)
        self.state.put(user_id=answer.user_id, device_id=device)
        return True

    # -- sync ---------------------------------------------------------------------

    async def sync(self, since: str, full_state: bool = False) -> Any:
        """One /sync from SINCE ("" for an initial sync); long-polls unless FULL_STATE."""
        self.client.next_batch = since or None   # so nio reads a repeated response again
        timeout = 0 if full_state else self.settings.poll_timeout * 1000
        return await self.call("sync", self.client.sync(
            timeout=timeout, sync_filter=SYNC_FILTER, since=since or None,
            full_state=full_state or None))

    async def ready(self, since: str) -> None:
        """Once per run: the full-state sync from SINCE, kept in `first` for the first fetch."""
        if self._started:
            return
        async with self._ready_lock:
            if not self._started:
                self.first = await self.sync(since, full_state=True)
                await self.housekeeping()
                self._started = True

    def take_first(self) -> Any:
        """The run's first sync, once (None afterwards)."""
        first, self.first = self.first, None
        return first

    async def housekeeping(self) -> None:
        """Upload our keys, learn others' devices and settle their trust, send key messages."""
        client = self.client
        async with self._keys_lock:
            if client.should_upload_keys:
                await self.call("keys upload", client.keys_upload())
            if client.should_query_keys:
                await self.call("keys query", client.keys_query())
            if client.should_claim_keys:
                await self.call("keys claim",
                                client.keys_claim(client.get_users_for_key_claiming()))
            self.trust.apply()
            if client.outgoing_to_device_messages:
                await self.call("to-device", client.send_to_device_messages())

    async def timeline(self, response: Any, since: str) -> list[tuple[str, Any]]:
        """Every joined room's new events in RESPONSE as (room id, event), oldest first per
        room: gaps filled back to SINCE, history from before the bot's arrival dropped."""
        events: list[tuple[str, Any]] = []
        for room_id, info in response.rooms.join.items():
            timeline = list(info.timeline.events)
            if info.timeline.limited and info.timeline.prev_batch and \
                    arrival(timeline, self.user_id) == 0:
                timeline = await self._backfill(room_id, info.timeline.prev_batch,
                                                since) + timeline
            events += [(room_id, event) for event in timeline[arrival(timeline,
                                                                       self.user_id):]]
        return events

    async def _backfill(self, room_id: str, start: str, since: str) -> list[Any]:
        """The events a limited sync left out, from START back to SINCE, oldest first."""
        from nio import MessageDirection
        older: list[Any] = []
        for _ in range(BACKFILL_PAGES):
            page = await self.call("messages", self.client.room_messages(
                room_id, start=start, end=since, direction=MessageDirection.back, limit=100))
            older += page.chunk
            if not page.chunk or not page.end or page.end == start:
                break
            start = page.end
        return older[::-1]

    # -- sending --------------------------------------------------------------------

    async def send(self, room_id: str, kind: str, content: dict[str, Any],
                   key: str | None = None) -> str:
        """One event to ROOM_ID (encrypted for trusted devices in an encrypted room); its id.
        With KEY, its transaction id is made of KEY, so sending it again (a retry, or a
        reply said again after a crash) gives the event the homeserver kept, not a
        second one (the spec's idempotent sends, per access token: the login is kept)."""
        from nio import OlmUnverifiedDeviceError
        room = self.client.rooms.get(room_id)
        if room is None:
            raise BridgeError(f"Matrix: the bot is not in room {room_id}")
        if room.encrypted:
            await self.housekeeping()
        for attempt in (1, 2):
            try:
                answer = await self.call("send", self.client.room_send(
                    room_id, kind, content, tx_id=transaction_id(key)))
                return answer.event_id
            except OlmUnverifiedDeviceError:   # a device appeared since: settle it, once
                if attempt == 2:
                    raise BridgeError("Matrix send: a device in the room is neither trusted "
                                      "nor blocked") from None
                await self.housekeeping()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close the connection and the stores."""
        try:
            await asyncio.wait_for(self.client.close(), 10)
        except Exception as error:   # closing must not stop the kernel's exit
            log.info("matrix: close: %s", type(error).__name__)
        database = getattr(self.client.store, "database", None)
        if database is not None:
            database.close()
        self.state.close()


def arrival(timeline: list[Any], user_id: str) -> int:
    """Where the bot's part of TIMELINE begins: after its own invite (or its join, when it
    joined uninvited); 0 when neither is in it.  What comes before is the room's history."""
    start = 0
    for index, event in enumerate(timeline):
        source = event.source
        if source.get("type") != "m.room.member" or source.get("state_key") != user_id:
            continue
        membership = nested(source, "content", "membership")
        before = nested(source, "unsigned", "prev_content", "membership")
        if membership == "invite" or (membership == "join" and before not in ("invite", "join")):
            start = index + 1
    return start
