"""Entries: the items of a conversation the model may see, and their retention."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from opencortex.llm.base import estimate_tokens

Retention = Literal["DROPPABLE", "REQUIRED", "PRESERVED"]
EntryKind = Literal["message", "summary", "recalled", "persona", "system"]
Role = Literal["user", "assistant", "system"]

RETENTIONS: tuple[Retention, ...] = ("DROPPABLE", "REQUIRED", "PRESERVED")


def count_tokens(text: str) -> int:
    """Estimate TEXT's size in tokens (the same estimate the LLM backends use)."""
    return estimate_tokens(text)


@dataclass(frozen=True)
class Entry:
    """One item of what the model may see."""

    id: str  # archive message id; "summary:<uuid>" for summaries
    role: Role
    text: str
    turn: int  # turn number on its branch (1-based); 0 for system/persona
    turn_type: str = "speech"  # speech/action/thought/yield/silence
    retention: Retention = "REQUIRED"
    kind: EntryKind = "message"
    tokens: int = 0  # filled by count_tokens when 0
    covers: tuple[str, ...] = field(default=())  # for summaries: the ids folded into it

    def __post_init__(self) -> None:
        if self.retention not in RETENTIONS:
            raise ValueError(f"unknown retention {self.retention!r}; "
                             f"use one of {', '.join(RETENTIONS)}")
        if not self.tokens:
            object.__setattr__(self, "tokens", count_tokens(self.text))
        if not isinstance(self.covers, tuple):
            object.__setattr__(self, "covers", tuple(self.covers))


# Words that, alone or a few together, carry no content worth keeping.
_CHIT_CHAT_WORDS = frozenset(
    """
    hi hello hey heya hiya yo howdy hola morning evening night gm gn
    good great nice cool neat awesome perfect excellent fine sweet
    thanks thank thx ty tysm cheers appreciated appreciate much very so a lot you u
    ok okay k kk okey alright
    got it understood noted gotcha roger
    lol lmao haha hahaha hehe rofl xd
    bye goodbye later cya see ya soon take care
    np welcome
    oh ah hmm mm uh um wow whoa oops
    sounds makes sense
    please pls and too all the that's thats it's its is i im i'm me
    """.split()
)
_WORD = re.compile(r"[a-z][a-z'\-]*")
_CODE_HINT = re.compile(r"[`{}\[\]<>=/\\|$#@*_]|\d")
_NO_TROUBLE = re.compile(r"\bno (?:problem|worries|prob)\b")
_MAX_CHIT_CHAT_WORDS = 4
_MAX_CHIT_CHAT_CHARS = 200    # small talk is short: a longer text never is (nor read whole)


# One regular expression each, not a loop over the characters: this runs on the event
# loop for every message (a longer text than _MAX_CHIT_CHAT_CHARS is never searched).
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")   # exactly Unicode categories L* and N*
# exactly the characters str.isdigit accepts: decimal digits and those below
_DIGIT = re.compile("[\\d\u00b2\u00b3\u00b9\u1369-\u1371\u19da\u2070\u2074-\u2079"
                    "\u2080-\u2089\u2460-\u2468\u2474-\u247c\u2488-\u2490\u24ea"
                    "\u24f5-\u24fd\u24ff\u2776-\u277e\u2780-\u2788\u278a-\u2792"
                    "\U00010a40-\U00010a43\U00010e60-\U00010e68\U00011052-\U0001105a"
                    "\U0001f100-\U0001f10a]")


def _emoji_or_punctuation_only(text: str) -> bool:
    """True when TEXT has no letters or digits at all (emoji, punctuation, symbols)."""
    return _LETTER_OR_DIGIT.search(text) is None


def is_chit_chat(text: str) -> bool:
    """True for short greetings, thanks and acknowledgements ("ok", "thanks!", "hi", 🙂)."""
    stripped = text.strip()
    if not stripped:
        return True
    if len(stripped) > _MAX_CHIT_CHAT_CHARS:     # searching megabytes held the loop ~100 ms
        return False
    if _emoji_or_punctuation_only(stripped):
        return True
    if _CODE_HINT.search(stripped) or _DIGIT.search(stripped):
        return False
    lowered = _NO_TROUBLE.sub("np", stripped.lower())
    words = _WORD.findall(lowered)
    if not words or len(words) > _MAX_CHIT_CHAT_WORDS:
        return False
    # Every letter run must be accounted for by a chit-chat word (no stray content).
    letters = re.sub(r"[^a-z'\-]+", " ", lowered).split()
    if len(letters) != len(words):
        return False
    return all(w.strip("'-") in _CHIT_CHAT_WORDS for w in words)


def default_retention(role: str, text: str, turn_type: str = "speech") -> Retention:
    """The retention a message gets unless pinned: thoughts and small talk may be dropped.

    Bare answers such as "yes" or "no" stay REQUIRED: they may be the decision that
    a previous question was waiting for.
    """
    if turn_type == "thought":
        return "DROPPABLE"
    if role in ("user", "assistant") and is_chit_chat(text):
        return "DROPPABLE"
    return "REQUIRED"
