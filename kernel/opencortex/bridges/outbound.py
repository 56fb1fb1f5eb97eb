"""Sending on a platform: splitting long text, pacing, retry-after.

- `split_text` cuts a reply into pieces of at most `limit` characters: at
  paragraph breaks first, then line breaks, then sentence ends, then spaces,
  and only as a last resort inside a word.  It avoids cutting inside a code
  block (``` fences or org `#+begin_…`/`#+end_…`); a block longer than one piece
  is closed at the cut and reopened in the next piece, so each piece renders.
- `Pacer` spaces messages out within a platform's published limits: at most one
  message per `per_chat` seconds in one chat and `per_second` overall; a
  low-priority message (a refusal to a stranger) takes a slot only when one is
  free at once (`try_now`), so it never delays the others.
- `deliver` sends pieces in order through a platform call, honouring the
  platform's retry-after (`RetryAfter`) a bounded number of times.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable

_BREAKS = (re.compile(r"\n\s*\n"), re.compile(r"\n"), re.compile(r"(?<=[.!?…])\s+"),
           re.compile(r"\s+"))
_OPEN = re.compile(r"^(```[^\n`]*|#\+begin_(\w+)[^\n]*)$", re.IGNORECASE | re.MULTILINE)
MAX_RETRIES = 5


class RetryAfter(Exception):
    """The platform asked to wait SECONDS before sending again."""

    def __init__(self, seconds: float):
        super().__init__(f"retry after {seconds:g} s")
        self.seconds = max(0.0, float(seconds))


def _open_block(text: str) -> str | None:
    """The opening line of a code block still open at the end of TEXT, else None."""
    opened: str | None = None
    for line in text.split("\n"):
        stripped = line.strip()
        if opened is None:
            if _OPEN.match(stripped):
                opened = stripped
        elif (opened.startswith("```") and stripped.startswith("```")) or \
                (not opened.startswith("```") and stripped.lower().startswith("#+end_")):
            opened = None
    return opened


def _closer(opening: str) -> str:
    if opening.startswith("```"):
        return "```"
    return "#+end_" + opening.split()[0][len("#+begin_"):]


def _cut(text: str, limit: int) -> tuple[int, int]:
    """Where to cut TEXT (longer than LIMIT): the span of the best break at or
    before LIMIT (the break itself is dropped), or a hard cut at LIMIT."""
    window = text[:limit + 1]
    for pattern in _BREAKS:
        found = [m for m in pattern.finditer(window) if 0 < m.start() <= limit]
        if pattern is _BREAKS[0]:   # prefer a break outside code blocks
            found = [m for m in found if _open_block(text[:m.start()]) is None] or found
        if found and found[-1].start() >= limit // 4:
            return found[-1].start(), found[-1].end()
    return limit, limit


def split_text(text: str, limit: int) -> list[str]:
    """TEXT in pieces of at most LIMIT characters, cut where a reader expects a cut."""
    if limit < 32:
        raise ValueError("a piece limit under 32 characters cannot hold a code fence")
    pieces: list[str] = []
    rest = text
    while len(rest) > limit:
        room = limit - 16   # leaves space to close a block cut in two
        at, after = _cut(rest, room)
        piece, rest = rest[:at].rstrip(), rest[after:]
        opening = _open_block(piece)
        if opening is not None:
            piece += "\n" + _closer(opening)
            rest = opening + "\n" + rest
        if piece.strip():
            pieces.append(piece)
    if rest.strip() or not pieces:
        pieces.append(rest)
    return pieces


class Pacer:
    """Waits so messages stay within a per-chat and a global rate.

    A message first waits for its chat's slot, then for a global slot, so a
    busy chat never holds up the others."""

    def __init__(self, per_chat: float, per_second: float,
                 clock: Callable[[], float] = time.monotonic):
        self.per_chat = per_chat
        self.interval = 1.0 / per_second
        self.clock = clock
        self._next_in_chat: dict[str, float] = {}
        self._next_global = 0.0

    async def wait(self, chat_id: str) -> None:
        """Return when a message to CHAT_ID may go out."""
        now = self.clock()
        at = max(now, self._next_in_chat.get(chat_id, 0.0))
        self._next_in_chat[chat_id] = at + self.per_chat
        if len(self._next_in_chat) > 10_000:
            self._next_in_chat = {k: v for k, v in self._next_in_chat.items() if v > now}
        if at > now:
            await asyncio.sleep(at - now)
        now = self.clock()
        at = max(now, self._next_global)
        self._next_global = at + self.interval
        if at > now:
            await asyncio.sleep(at - now)

    def try_now(self, chat_id: str) -> bool:
        """Take a slot for a low-priority message to CHAT_ID only if the global budget
        and the chat are free at once (True); never queues, so it delays no one."""
        now = self.clock()
        if self._next_global > now or self._next_in_chat.get(chat_id, 0.0) > now:
            return False
        self._next_in_chat[chat_id] = now + self.per_chat
        self._next_global = now + self.interval
        return True


async def with_retry_after(send: Callable[[], Awaitable[object]], *,
                           max_wait: float = 60.0) -> object:
    """Call SEND, waiting and retrying when the platform says `RetryAfter` (bounded)."""
    for attempt in range(MAX_RETRIES + 1):
        try:
            return await send()
        except RetryAfter as error:
            if attempt == MAX_RETRIES or error.seconds > max_wait:
                raise
            await asyncio.sleep(error.seconds)
    raise AssertionError("unreachable")
