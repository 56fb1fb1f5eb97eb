"""Messages a bridge archived already, recognised in an export by side, text and time.

A Telegram Desktop export of a chat the Telegram bridge served holds what the
bridge archived as it came: the person's messages and the bot's replies.  In a
supergroup or channel the person's messages are found by their Telegram id
(PLATFORM_ID, see `telegram_export`); in a private chat or basic group the
export's ids are not the bot's, and the bot's replies carry none anywhere.  So
an exported message is taken for one the bridge archived when its thread holds
a message archived by a bridge (not imported) that

- is of the same side: the person's (role user, the same sender: the bridge
  and the export both name a person by their Telegram id) or the bot's (role
  assistant or system, for an exported message of the assistant, or of a sender
  the bridge never archived a message of: the bot itself);
- says the same: one of the item's texts (see `importer.Item`: as exported,
  and as the bot received it), bar the spaces Telegram trims, or, for the bot,
  what the person read of the archived reply (`bridges.render.shown_text`);
- was archived between EARLY seconds before the export's time and PERSON_LATE
  (BOT_LATE) seconds after it.  The export's time is Telegram's, in whole
  seconds (`date_unixtime`).  The bridge dates a person's message by that same
  time, Telegram's `date` (see `events.ChatMessage.said_at`), however late it
  took it; a bridge from before that stamped it when their chat's turn began:
  after delivery (long polling: under a second) and after the turns of their
  earlier messages (a model's answer: seconds, rarely a minute), never
  earlier but for the two clocks' difference (EARLY allows this machine's
  clock 2 s off, which NTP keeps within milliseconds).  It archives a reply
  before it sends it (a bridge from before 2026-11 right after Telegram took
  it, up to BOT_LATE seconds): up to BOT_EARLY seconds before Telegram's time,
  as the chat's pace, a retry and the earlier pieces of a long reply may delay
  the send.  A reply too long for one Telegram message went out in pieces
  (`outbound.split_text`), each a message of the export: the archived reply
  stands for each of them once.

Each archived message stands for one exported message at most (a long reply:
for one per piece), the nearest in time not taken yet.  So two "ok" of one
person seconds apart, both archived, are both recognised, and of two the
bridge did not both archive, one is imported: what was said is never dropped
(of two same texts within PERSON_LATE seconds, the one imported may carry the
other's time).  What the tolerance misses is imported again: a message an
older bridge took more than PERSON_LATE seconds late (the kernel was down when
it was sent), an edited one (the export has the new text), and the times of an
export without `date_unixtime` made in another time zone.

Bounded: one indexed query per exported message (on thread and time, see
`timeline`), the bridge's time span and senders read once per thread, and the
taken ids kept only as long as a later message could still name them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from opencortex.events import Thread
from opencortex.memory.archive import Archive
from opencortex.memory.rows import PLATFORM_ID

if TYPE_CHECKING:
    from opencortex.memory.importer import Item

EARLY = 2.0                  # seconds the bridge's time may precede the export's
PERSON_LATE = 60.0           # ... and follow it, for a person's message
BOT_LATE = 10.0              # ... for the bot's reply (a bridge from before 2026-11 wrote
                             # it after sending it)
BOT_EARLY = 60.0             # seconds a reply may be archived before Telegram's time: it
                             # is written, then sent (after its chat's pace, a retry, the
                             # pieces of a long one before it)
MAX_TAKEN = 4096             # taken ids kept before those no later message can name go
MAX_FORMS = 4096             # archived messages whose forms (see `seen_forms`) are kept
BOT_ROLES = ("assistant", "system")


def seen_forms(role: str, archived: str) -> list[frozenset[str]]:
    """Each piece of the ARCHIVED text of a message of ROLE as an export may hold it
    (stripped): for the person, the text as written; for the bot, also as the person
    read it formatted (or as plain text, where Telegram refused the formatting), and
    a reply too long for one Telegram message as the pieces the bridge sent (see
    `outbound.split_text`).  The first piece's forms include the whole as written."""
    if role == "user":
        return [frozenset((archived.strip(),))]
    from opencortex.bridges.outbound import split_text
    from opencortex.bridges.render import plain, shown_text
    from opencortex.bridges.telegram import TEXT_LIMIT
    pieces = [archived] if len(archived) <= TEXT_LIMIT else split_text(archived, TEXT_LIMIT)
    forms = [frozenset((shown_text(piece).strip(), plain(piece).strip())) for piece in pieces]
    return [forms[0] | {archived.strip()}, *forms[1:]]


class _Taken:
    """The archived messages of one thread that stand for an exported one already."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}    # id -> when it was archived
        self.floor = -math.inf               # taken ones before this time were let go

    def take(self, message_id: str, archived_at: float, exported_at: float) -> None:
        """MESSAGE_ID (archived at ARCHIVED_AT) stands for a message of EXPORTED_AT; past
        MAX_TAKEN, those no later message of an export in time order can name go."""
        self.times[message_id] = archived_at
        if len(self.times) > MAX_TAKEN:
            self.floor = max(self.floor, exported_at - EARLY)
            self.times = {i: t for i, t in self.times.items() if t >= self.floor}


class _ThreadCopies:
    """What a bridge archived of one thread, matched against exported messages."""

    def __init__(self, archive: Archive, thread: Thread,
                 span: tuple[float, float, frozenset[str]]):
        self.archive, self.thread = archive, thread
        self.first, self.last, self.people = span
        self.taken = _Taken()
        self._forms: dict[str, list[frozenset[str]]] = {}   # archived id -> `seen_forms`

    def take(self, item: Item) -> bool:
        """Whether ITEM is a copy of a message archived here, not taken yet (taken then)."""
        message = item.message
        bot = message.role != "user" or message.sender not in self.people
        when = message.timestamp
        start = max(when - (BOT_EARLY if bot else EARLY), self.taken.floor)
        end = when + (BOT_LATE if bot else PERSON_LATE)
        if end < self.first or start > self.last:
            return False
        rows = self.archive.bridged_between(
            self.thread, start, end, BOT_ROLES if bot else ("user",),
            None if bot else message.sender, platform_ids=PLATFORM_ID not in message.extra)
        found = min(((abs(at - when), key, at) for key, at in self._pieces(item, rows)
                     if key not in self.taken.times), default=None)
        if found is None:
            return False
        self.taken.take(found[1], found[2], when)
        return True

    def _pieces(self, item: Item, rows: list[tuple[str, str, str, float]]
                ) -> list[tuple[str, float]]:
        """(key, when archived) of the archived ROWS (id, role, text, time) ITEM is the
        whole or a piece of: the id, and "/N" after it for piece N of a long reply.
        Each row's forms are worked out once (a row is in the window of several
        exported messages), for the last MAX_FORMS rows."""
        found = []
        for message_id, role, text, at in rows:
            forms = self._forms.get(message_id)
            if forms is None:
                if len(self._forms) >= MAX_FORMS:
                    self._forms.clear()
                forms = self._forms[message_id] = seen_forms(role, text)
            piece = next((number for number, seen in enumerate(forms)
                          if not seen.isdisjoint(item.bridge_texts)), None)
            if piece is not None:
                found.append((message_id if piece == 0 else f"{message_id}/{piece}", at))
        return found


class BridgedCopies:
    """Recognises exported messages a bridge archived already (see the module), in the
    exported chat's thread or in its topics' (an export of a forum holds them all)."""

    def __init__(self, archive: Archive):
        self.archive = archive
        self._threads: dict[Thread, list[_ThreadCopies]] = {}   # by the exported thread
        self._platform_ids: dict[Thread, set[str]] = {}
        self._with_topics: dict[Thread, list[Thread]] = {}

    def archived(self, item: Item) -> bool:
        """Whether a bridge archived ITEM already, as it came in: a message of its thread
        (or of a topic of it) has its platform id (PLATFORM_ID), or is, by side, text
        and time, its copy that no other item of this import stands for."""
        thread = item.message.thread
        platform_id = item.message.extra.get(PLATFORM_ID)
        if platform_id is not None:
            if thread not in self._platform_ids:
                self._platform_ids[thread] = set().union(
                    *(self.archive.platform_ids(each) for each in self._conversations(thread)))
            if platform_id in self._platform_ids[thread]:
                return True
        if not item.bridge_texts or item.message.timestamp is None:
            return False
        if thread not in self._threads:
            spans = ((each, self.archive.bridged_span(each))
                     for each in self._conversations(thread))
            self._threads[thread] = [_ThreadCopies(self.archive, each, span)
                                     for each, span in spans if span is not None]
        return any(copies.take(item) for copies in self._threads[thread])

    def _conversations(self, thread: Thread) -> list[Thread]:
        """THREAD and the archived threads of its topics (see `events.Thread.chat`), as
        the archive held them when first asked (one listing per exported thread)."""
        found = self._with_topics.get(thread)
        if found is None:
            found = self._with_topics[thread] = [thread, *(
                each for each in self.archive.threads()
                if each != thread and Thread(*each).chat == thread)]
        return found
