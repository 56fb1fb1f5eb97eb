"""A person on Matrix, for the tests and the benchmark: a second matrix-nio client with its
own crypto store, driven by hand (sync, send, react) with every wait bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nio import (AsyncClient, AsyncClientConfig, MegolmEvent, RoomCreateError,
                 RoomMemberEvent, RoomMessage)

from synapse import Account, Homeserver

ENCRYPTION = {"type": "m.room.encryption", "state_key": "",
              "content": {"algorithm": "m.megolm.v1.aes-sha2"}}


class Person:
    """One account on one device; `events` holds every room event it synced, decrypted
    when it could be, and `to_device` every to-device event."""

    def __init__(self, homeserver: Homeserver, account: Account, store: Path,
                 device_id: str = ""):
        store.mkdir(parents=True, exist_ok=True)
        self.account = account
        self.client = AsyncClient(homeserver.url, account.user_id, store_path=str(store),
                                  config=AsyncClientConfig(store_sync_tokens=False,
                                                           max_timeouts=0))
        self._device_id = device_id
        self.events: list[tuple[str, Any]] = []
        self.to_device: list[Any] = []

    @property
    def user_id(self) -> str:
        return self.account.user_id

    async def start(self) -> Person:
        """Log in (a new device unless given one) and make the first sync."""
        if self._device_id:
            self.client.restore_login(self.user_id, self._device_id, self.account.access_token)
        else:
            await self.client.login(self.account.password, device_name="person")
        await self.sync(0)
        return self

    async def sync(self, timeout_ms: int = 300) -> None:
        """One sync, then the key work a client does after it."""
        response = await self.client.sync(timeout=timeout_ms, since=self.client.next_batch)
        for room_id, info in getattr(response, "rooms").join.items():
            self.events += [(room_id, event) for event in info.timeline.events]
        self.to_device += response.to_device_events
        if self.client.should_upload_keys:
            await self.client.keys_upload()
        if self.client.should_query_keys:
            await self.client.keys_query()
        if self.client.should_claim_keys:
            await self.client.keys_claim(self.client.get_users_for_key_claiming())
        await self.client.send_to_device_messages()

    async def until(self, predicate: Callable[[], Any], seconds: float = 30.0) -> Any:
        """Sync until PREDICATE() is truthy (its value), at most SECONDS."""
        deadline = asyncio.get_running_loop().time() + seconds
        while not (value := predicate()):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{self.user_id}: timed out waiting")
            await self.sync()
        return value

    async def create_room(self, invite: list[str], encrypted: bool = True,
                          public: bool = False) -> str:
        from nio import RoomPreset
        answer = await self.client.room_create(
            invite=invite, is_direct=not public,
            preset=RoomPreset.public_chat if public else RoomPreset.private_chat,
            initial_state=[ENCRYPTION] if encrypted else [])
        assert not isinstance(answer, RoomCreateError), answer
        await self.sync(0)
        return answer.room_id

    def membership(self, room_id: str, user_id: str) -> str:
        """USER_ID's latest membership in ROOM_ID, as synced ("" if none)."""
        found = [e.membership for r, e in self.events
                 if r == room_id and isinstance(e, RoomMemberEvent) and e.state_key == user_id]
        return found[-1] if found else ""

    async def say(self, room_id: str, text: str, **content: Any) -> str:
        """Send TEXT (encrypted in an encrypted room); its event id."""
        answer = await self.client.room_send(room_id, "m.room.message",
                                             {"msgtype": "m.text", "body": text, **content},
                                             ignore_unverified_devices=True)
        assert hasattr(answer, "event_id"), answer
        return answer.event_id

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        answer = await self.client.room_send(room_id, "m.reaction", {"m.relates_to": {
            "rel_type": "m.annotation", "event_id": event_id, "key": key}})
        assert hasattr(answer, "event_id"), answer
        return answer.event_id

    def messages(self, room_id: str, sender: str) -> list[Any]:
        """The m.room.message events SENDER sent in ROOM_ID (undecryptable ones included)."""
        return [e for r, e in self.events if r == room_id and e.sender == sender
                and isinstance(e, (RoomMessage, MegolmEvent))]

    def bodies(self, room_id: str, sender: str) -> list[str]:
        """The bodies of SENDER's messages in ROOM_ID ("<undecryptable>" for those)."""
        return [getattr(e, "body", "<undecryptable>") for e in self.messages(room_id, sender)
                if not (e.source.get("content", {}).get("m.relates_to", {})
                        .get("rel_type") == "m.replace")]

    async def close(self) -> None:
        await self.client.close()
        database = getattr(self.client.store, "database", None)
        if database is not None:
            database.close()
