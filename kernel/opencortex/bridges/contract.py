"""The bridge contract: what a platform module implements, and what it may raise.

A platform module (telegram.py, matrix.py, signal.py) speaks its platform's
protocol and nothing else: it fetches messages as `Inbound` (or a person's
`Decision` on an approval), sends text it is given, shows typing, and shows
approval controls.  Every policy — who may talk, flood control, splitting,
formatting, pacing, approvals, durability, privacy — lives in the shared
bridge modules (`access`, `outbound`, `render`, `approvals`, `inbox`,
`service`), tested once for all platforms.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opencortex.bridges.inbound import Inbound
from opencortex.throttled_log import ThrottledLog

log = logging.getLogger(__name__)


class BridgeError(Exception):
    """The platform failed (bad token, network down, protocol error); the message says
    what to do and never holds a token or message content.  The bridge reports it and
    retries with backoff; `fatal` errors (a token the platform rejects) wait longer."""

    def __init__(self, message: str, *, fatal: bool = False):
        super().__init__(message)
        self.fatal = fatal


class Unreadable:
    """What a platform module does with one incoming item (an update, an event, an
    envelope) it fails to read: skip it, with a log line naming the item and the
    error's type (never its text, which may quote the item), at most one a minute.
    A BridgeError still fails the whole fetch, which the bridge retries: the
    platform failed, not the item.  Without this, one odd item failed its batch on
    every retry, and the messages after it were never read."""

    def __init__(self, channel: str):
        self._log = ThrottledLog(f"{channel}: skipped an incoming item it could not read",
                                 logger=log)

    @contextmanager
    def skipped(self, item: str) -> Iterator[None]:
        """Run the reading of ITEM (its id, for the log); an error skips it."""
        try:
            yield
        except BridgeError:
            raise
        except Exception as error:
            self._log(f" ({item}: {type(error).__name__})")


def remember(table: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """TABLE[KEY] = VALUE as its newest entry, the oldest forgotten past LIMIT entries: what
    a bridge remembers of what others send is bounded, however much they send."""
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]


class FormattingRejected(Exception):
    """The platform refused the formatted text; the bridge sends it plain instead."""


@dataclass(frozen=True)
class Decision:
    """A person's answer to an approval, from a button or a reaction."""

    position: int
    chat_id: str
    sender_id: str
    approval_id: str
    digest: str
    approve: bool
    token: Any = None   # what the platform needs to acknowledge the click


class Platform(abc.ABC):
    """One chat platform, as the bridge sees it."""

    channel: str = ""          # the kernel channel: "telegram", "matrix", "signal"
    text_limit: int = 4000     # characters per message (before formatting)
    per_chat: float = 1.0      # seconds between messages in one chat
    per_second: float = 25.0   # messages per second overall

    @abc.abstractmethod
    async def start(self) -> str:
        """Connect and check credentials; the bot's own name.  BridgeError if it cannot."""

    @abc.abstractmethod
    async def fetch(self) -> list[Inbound | Decision]:
        """The next messages and decisions, waiting at most the platform's poll time."""

    @abc.abstractmethod
    async def acknowledge(self) -> None:
        """Everything fetched so far is safely kept (in the bridge's inbox): the platform
        may forget it (Telegram: the next getUpdates asks from after it)."""

    async def register_commands(self, commands: list[tuple[str, str]]) -> None:
        """Offer the kernel's slash commands in the platform's menu (default: nothing)."""

    @abc.abstractmethod
    async def send(self, chat_id: str, html: str, plain: str, key: str | None = None,
                   reply_to: str | None = None) -> None:
        """Send one message (HTML, or PLAIN if the platform has no formatting).  KEY, when
        given, names this message: a platform with idempotent sends (Matrix's
        transaction ids) sends a message of a KEY it sent before only once (a reply
        said again after a crash); the others send it again.  REPLY_TO, when given,
        is the id (`Inbound.message_id`) of the person's message this answers: the
        platform shows it as an answer where its people expect one (Telegram, Signal:
        quoted in a group; Matrix: in that message's thread).
        Raises FormattingRejected, `outbound.RetryAfter` or BridgeError."""

    @abc.abstractmethod
    async def typing(self, chat_id: str) -> None:
        """Show that a reply is being written (the bridge repeats it while the turn runs)."""

    @abc.abstractmethod
    async def show_approval(self, chat_id: str, text: str, approval_id: str,
                            digest: str, reply_to: str | None = None) -> Any:
        """Show TEXT with Approve/Deny controls bound to APPROVAL_ID and DIGEST, as the answer
        to the message REPLY_TO (as `send` does); a handle."""

    @abc.abstractmethod
    async def settle_approval(self, chat_id: str, handle: Any, outcome: str) -> None:
        """Replace the controls of a shown approval by its OUTCOME."""

    async def answer_decision(self, decision: Decision, text: str) -> None:
        """Tell the person who clicked what became of it (default: nothing)."""

    async def stop(self) -> None:
        """Release connections."""
