"""Who may talk to the kernel over a bridge, and how fast: deny by default.

`Gate.decide` answers for one incoming message, before anything of it reaches a
model, a skill, the archive or a log line:

- a direct message from a sender on the `allow` list (ids, never usernames) is
  let in, as is one whose platform vouches that one of the sender's other ids is
  on it (`Inbound.sender_aliases`: a Signal number); the gate then knows the
  sender's id as allowed for the rest of the run (the settings are never
  changed: they are the configuration as written).  Anyone else is a stranger:
  one short refusal now and then (at most one per `refusal_interval` per
  sender), or silence when configured;
- in a group, only when the group is on the `groups` list, the sender is
  allowed, and the message mentions or replies to the bot; everything else in
  a group is ignored (a group never gets a refusal);
- an allowed sender over `messages_per_minute` gets one notice per minute and
  the excess is dropped, never sent to the model.

Strangers and drops are counted (`Gate.counts`) so `/metrics` and `doctor` can
show them; their content is never kept.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Literal

from opencortex.bridges.contract import remember
from opencortex.bridges.inbound import Inbound
from opencortex.bridges.settings import BridgeSettings

log = logging.getLogger(__name__)

Decision = Literal["allow", "refuse", "flood-notice", "ignore"]
WINDOW = 60.0   # seconds of the flood window
MAX_TRACKED = 10_000   # senders remembered for refusals; the oldest are forgotten


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str   # a counter name: allowed, stranger, group-not-allowed, …


class Gate:
    """Access and flood control for one bridge."""

    def __init__(self, settings: BridgeSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self._refused: dict[str, float] = {}
        self._recent: dict[str, deque[float]] = {}
        self._noticed: dict[str, float] = {}
        self._allow = frozenset(settings.allow)
        self._by_alias: dict[str, float] = {}   # sender ids let in through an alias

    def decide(self, message: Inbound) -> Verdict:
        """Whether MESSAGE goes on to the kernel, and if not, what the sender is told."""
        if not self.is_allowed(message.sender_id) and self._alias_allowed(message):
            remember(self._by_alias, message.sender_id, self.clock(), MAX_TRACKED)
            log.info("an allowed id writes as sender %s; that id is allowed now",
                     message.sender_id)
        verdict = self._access(message)
        if verdict.decision == "allow":
            verdict = self._flood(message.sender_id)
        self.counts[verdict.reason] += 1
        return verdict

    def is_allowed(self, sender_id: str) -> bool:
        """Whether SENDER_ID is on the allow list, or was let in through an alias."""
        return sender_id in self._allow or sender_id in self._by_alias

    def _alias_allowed(self, message: Inbound) -> bool:
        """Whether the allow list names one of MESSAGE's sender's other ids."""
        return any(alias in self._allow for alias in message.sender_aliases)

    def may_speak(self, message: Inbound) -> bool:
        """Whether MESSAGE's content may be kept at all: from an allowed sender, and in a
        group only in an allowed one (nothing is counted; `decide` still decides)."""
        if not (self.is_allowed(message.sender_id) or self._alias_allowed(message)):
            return False
        return not message.is_group or message.chat_id in self.settings.groups

    def _access(self, message: Inbound) -> Verdict:
        allowed = self.is_allowed(message.sender_id)
        if message.is_group:
            if message.chat_id not in self.settings.groups:
                return Verdict("ignore", "group-not-allowed")
            if not allowed:
                return Verdict("ignore", "group-stranger")
            if not message.addressed_to_bot:
                return Verdict("ignore", "group-not-addressed")
            return Verdict("allow", "allowed")
        if allowed:
            return Verdict("allow", "allowed")
        if self.settings.strangers == "silence":
            return Verdict("ignore", "stranger")
        now = self.clock()
        last = self._refused.get(message.sender_id)
        if last is not None and now - last < self.settings.refusal_interval:
            return Verdict("ignore", "stranger")
        remember(self._refused, message.sender_id, now, MAX_TRACKED)
        return Verdict("refuse", "stranger")

    def _flood(self, sender_id: str) -> Verdict:
        now = self.clock()
        recent = self._recent.setdefault(sender_id, deque())
        while recent and now - recent[0] >= WINDOW:
            recent.popleft()
        if len(recent) < self.settings.messages_per_minute:
            recent.append(now)
            return Verdict("allow", "allowed")
        noticed = self._noticed.get(sender_id)
        if noticed is not None and now - noticed < WINDOW:
            return Verdict("ignore", "flood")
        remember(self._noticed, sender_id, now, MAX_TRACKED)
        return Verdict("flood-notice", "flood")



def flood_notice(settings: BridgeSettings) -> str:
    return (f"You are sending messages faster than {settings.messages_per_minute} a minute; "
            "I skipped some. Wait a minute, then send again.")
