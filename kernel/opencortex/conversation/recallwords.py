"""The words of a recall question: which are worth matching, and whether it asks.

Function words ("the", "what", "did") match almost every message and would
recall noise, so a question is searched by its other words (`recall_query`);
one made only of them names nothing to match.  Words joined by ":" or "/"
("TCP/IP", "client:server", "memory/query.py") are searched as written (the
index reads them as one phrase: "TCP/IP" finds "TCP/IP" and "TCP IP") and by
their parts too, so that a message naming one of them is found after those
naming both; numbers ("10:30"), function words ("and/or") and a link's scheme
("https:") are no parts worth matching.  A text asks something when it
ends with a question mark, whatever script or emoji follows, or a sentence near
its end does (`asks`), or it opens with a question word (`is_question`); a
recalled question brings the reply after it, a reply the question before it
(`partner_of`).
"Now" is a function word, but in a question it asks for the present state, and
a statement of it often says so too ("I'm working as a nurse now"): it ranks
the matches of the other words, never matching alone (`present_words`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opencortex.memory.query import bare_word

if TYPE_CHECKING:
    from opencortex.memory import MessageRecord

# Function words, left out of a recall query.
_STOPWORDS = frozenset("""
a about above after again all also am an and any are as at be because been before being
below between both but by can could did do does doing done down during each either few
for from further had has have having he her here hers him his how i if in into is it its
itself just let like me more most my neither no nor not now of off on once only or other
our ours out over own please same she should so some such than that the their theirs
them then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours
""".split())
_PRESENT = frozenset({"now"})   # function words asking for the present: they rank
_JOINED = re.compile(r"[:/]")
_LINK_WORDS = frozenset("http https ftp file mailto www".split())
MAX_PARTS = 4                # parts of one joined word searched, at most (the last ones)
QUESTION_MARKS = ("?", "\uff1f", "\u061f")   # ?, the fullwidth ？ and the Arabic ؟
_ASKS = re.compile("[" + "".join(QUESTION_MARKS) + r"]\W*\Z")
ASKED_TAIL = 160             # a question ending a sentence this close to the end asks
_ASKS_BEFORE = re.compile("[" + "".join(QUESTION_MARKS) + r"]+[!\"'”’)\]]*\s+\S")
_QUESTION_WORDS = frozenset("""what when where which who whom whose why how did does do is are
was were can could will would should has have had""".split())


def recall_query(text: str) -> str:
    """The words of TEXT worth searching for: without function words and marks standing
    alone ("" when that is all: "what did we do?" names nothing to match), a word
    joined by ":" or "/" followed by its parts worth matching ("TCP/IP" -> "TCP/IP TCP
    IP")."""
    words: list[str] = []
    for word in text.split():
        bare = bare_word(word)
        if bare and bare.casefold() not in _STOPWORDS:
            words.append(word)
            words += joined_parts(bare)
    return " ".join(words)


def joined_parts(word: str) -> list[str]:
    """The parts of WORD joined by ":" or "/" worth matching on their own ("TCP/IP" ->
    TCP, IP): two characters or more with a letter, no function word or link scheme;
    the last MAX_PARTS of them (a path ends with its most telling part)."""
    if not _JOINED.search(word):
        return []
    parts = (bare_word(part) for part in _JOINED.split(word))
    kept = [part for part in parts if len(part) > 1 and any(c.isalpha() for c in part)
            and part.casefold() not in _STOPWORDS and part.casefold() not in _LINK_WORDS]
    return list(dict.fromkeys(kept))[-MAX_PARTS:]


def searched_words(question: str, undated: str) -> str:
    """The words recall searches for QUESTION, UNDATED being it without its date
    expression: UNDATED's when anything is left of it, else the question's."""
    return recall_query(undated if undated.strip() else question)


def present_words(question: str) -> str:
    """The function words of QUESTION that ask for the present state ("now"; "" when
    none): recall ranks the matches of its other words by them too."""
    found = (bare_word(word).casefold() for word in question.split())
    return " ".join(dict.fromkeys(word for word in found if word in _PRESENT))


def asks(text: str) -> bool:
    """True when TEXT ends with a question mark ("?", "？", "؟"), whatever follows it
    that is not a word ("?!", "? 🙂", "?)"), or a sentence of its last ASKED_TAIL
    characters does ("What got you into it? I'd love to try."; a link's "?q=" asks
    nothing)."""
    return _ASKS.search(text[-64:]) is not None or \
        _ASKS_BEFORE.search(text[-ASKED_TAIL:]) is not None


def is_question(text: str) -> bool:
    """True when TEXT asks something: it ends with "?" or opens with a question word."""
    words = text.split(maxsplit=1)
    return asks(text) or bool(words) and \
        bare_word(words[0]).casefold() in _QUESTION_WORDS


def without_names(text: str, names: Sequence[str]) -> str:
    """TEXT without the words NAMES (and their possessive "'s"), or TEXT itself when
    nothing else would be left."""
    if not names:
        return text
    pattern = r"\b(?:%s)(?:['’]s)?\b" % "|".join(re.escape(name) for name in names)
    rest = " ".join(re.sub(pattern, " ", text, flags=re.IGNORECASE).split())
    return rest if any(c.isalnum() for c in rest) else text


def partner_of(hit: MessageRecord, before: MessageRecord | None,
               after: MessageRecord | None) -> MessageRecord | None:
    """The reply to HIT when it is a question (AFTER, the next message: only looked for
    then), or the question HIT replies to (BEFORE, the message before it), if either is."""
    speaker = (hit.role, hit.sender)
    if after is not None and asks(hit.text) and (after.role, after.sender) != speaker:
        return after
    if before is not None and asks(before.text) and (before.role, before.sender) != speaker:
        return before
    return None
