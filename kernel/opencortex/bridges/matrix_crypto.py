"""End-to-end encryption policy of the Matrix bridge, on matrix-nio's crypto store.

`DeviceTrust` decides whose devices receive the room keys of the bot's
messages and whose encrypted messages count:

- `trust = "tofu"` (default): every device of an allowed user (the `allow` and
  `approvers` lists) is trusted the first time the bot sees it.  matrix-nio
  keeps the first signing key it saw for a device id and ignores a later,
  different one, so a device cannot be swapped under its id;
- `trust = "verified"`: only the devices listed in `verified_devices` with the
  ed25519 fingerprint the person's client shows ("session key"); a message
  counts only when it was encrypted by such a device with a key received
  directly from it (not forwarded).

Every other device is blacklisted: it never gets a key to the bot's messages.

`Undecrypted` holds the messages the bot could not decrypt while their key is
requested, and tries them again after each sync, for a while.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from opencortex.bridges.contract import remember
from opencortex.bridges.settings import MatrixSettings

log = logging.getLogger(__name__)

KEY_WAIT = 600.0     # seconds an undecryptable message waits for its key
MAX_WAITING = 200    # undecryptable messages kept waiting at once


def fingerprint(text: str) -> str:
    """An ed25519 fingerprint as matrix-nio stores it (clients show it spaced in groups)."""
    return "".join(text.split())


class DeviceTrust:
    """Marks devices verified or blacklisted in matrix-nio's store, by the bridge's policy."""

    def __init__(self, settings: MatrixSettings, client: Any):
        self.settings = settings
        self.client = client
        self.people = frozenset(settings.allow) | frozenset(settings.approvers)

    def trusted(self, device: Any) -> bool:
        """Whether DEVICE (a nio OlmDevice) may read the bot's messages."""
        if self.settings.trust == "tofu":
            return device.user_id in self.people
        expected = self.settings.verified_devices.get(device.user_id, {}).get(device.id)
        return expected is not None and fingerprint(expected) == device.ed25519

    def apply(self) -> None:
        """Settle every device of every encrypted room the bot is in."""
        if self.client.olm is None:
            return
        for room in list(self.client.rooms.values()):
            if room.encrypted:
                for devices in self.client.room_devices(room.room_id).values():
                    for device in devices.values():
                        self._settle(device)

    def _settle(self, device: Any) -> None:
        if device.deleted:
            return
        if self.trusted(device):
            if device.blacklisted:
                self.client.unblacklist_device(device)
            if not device.verified:
                self.client.verify_device(device)
                log.info("matrix: trusting device %s of %s", device.id, device.user_id)
        elif not device.blacklisted:
            if device.verified:
                self.client.unverify_device(device)
            self.client.blacklist_device(device)
            log.info("matrix: device %s of %s gets no keys", device.id, device.user_id)

    def sender_trusted(self, event: Any, room_id: str) -> bool:
        """Whether EVENT (decrypted, or plain) counts as sent by a trusted device."""
        if self.settings.trust == "tofu":
            return True
        if not getattr(event, "decrypted", False) or self.client.olm is None:
            return False    # a plain message names no device
        session = self.client.olm.inbound_group_store.get(room_id, event.sender_key,
                                                          event.session_id)
        if session is None or session.forwarding_chain:
            return False
        for device in self.client.device_store.active_user_devices(event.sender):
            if device.curve25519 == event.sender_key:
                return device.ed25519 == session.ed25519 and self.trusted(device)
        return False


class Undecrypted:
    """Encrypted messages waiting for their key: requested once, retried after each sync."""

    def __init__(self, client: Any):
        self.client = client
        self._waiting: dict[str, tuple[float, Any]] = {}

    def keep(self, event: Any) -> bool:
        """Keep EVENT (a nio MegolmEvent) for `retry`; whether its key is still to be asked
        for (once per megolm session)."""
        remember(self._waiting, event.event_id, (time.monotonic(), event), MAX_WAITING)
        return event.session_id not in self.client.outgoing_key_requests

    def retry(self) -> list[tuple[str, Any]]:
        """The waiting messages that decrypt now, as (room id, event); forgets expired ones."""
        from nio import EncryptionError, MegolmEvent
        now, ready = time.monotonic(), []
        for event_id, (since, event) in list(self._waiting.items()):
            try:
                decrypted = self.client.decrypt_event(event)
            except EncryptionError:
                if now - since > KEY_WAIT:
                    del self._waiting[event_id]
                continue
            del self._waiting[event_id]
            if not isinstance(decrypted, MegolmEvent):
                ready.append((event.room_id, decrypted))
        return ready
