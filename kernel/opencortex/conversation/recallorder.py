"""The order of recall's lexical hits: bounded bonuses for being newer and for naming
the person asked about, and what the people a question names said leading the other
matches.

A name that is in many of an owner's messages weighs ~nothing in BM25 (and a very
common one is not ranked at all), so among statements alike but for whom they are
about ("Did you hear Rosa broke an arm?", "Did you hear Dev broke an arm?") the
ranking cannot tell which one a question about Rosa asks for.  The matches of the
other words are read a few times K (see `recall.CANDIDATES`) and one whose text
names a person the question names, or that person sent, counts up to NAME_WEIGHT
more: a tie goes to it, a clearly better match of the other words still leads.
It is computed on the texts already read (no further search)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from opencortex.memory import SearchHit
from opencortex.memory.rows import who
from opencortex.memory.senders import fold_words, folded_words

RECENCY_WEIGHT = 0.5           # "now": the newest candidate's score counts this much more
NAME_WEIGHT = 0.25             # a hit naming (or sent by) a person asked about: this much more
SAID_PER_OTHER = 2             # hits of what a named person said per other hit, in turn


def newer_first(hits: list[SearchHit]) -> list[SearchHit]:
    """HITS re-ranked with a bonus for being newer (up to RECENCY_WEIGHT of the score)."""
    return reranked(hits, recent=True)


def reranked(hits: list[SearchHit], names: Sequence[str] = (), *,
             recent: bool = False) -> list[SearchHit]:
    """HITS re-ranked with bounded bonuses: NAME_WEIGHT of the score for naming one of
    NAMES (words of the question that name a sender) in the text or the sender, and
    with RECENT up to RECENCY_WEIGHT for being newer (the newest the most)."""
    if len(hits) < 2 or not (names or recent):
        return hits
    people = [set(fold_words(name)) for name in names]
    people = [person for person in people if person]
    oldest = min(hit.timestamp for hit in hits)
    span = max(hit.timestamp for hit in hits) - oldest or 1.0

    def names_one(hit: SearchHit) -> bool:
        if not people:
            return False
        words = {*fold_words(hit.text), *fold_words(who(hit.sender, hit.extra))}
        return any(person <= words for person in people)

    def weight(hit: SearchHit) -> float:
        bonus = 1 + NAME_WEIGHT if names_one(hit) else 1.0
        if recent:
            bonus *= 1 + RECENCY_WEIGHT * (hit.timestamp - oldest) / span
        return hit.score * bonus
    return sorted(hits, key=lambda hit: -weight(hit))


def mix_named(said: list[SearchHit], general: list[SearchHit]) -> list[SearchHit]:
    """SAID (what the people named said) two at a time, then one of GENERAL, in their
    orders: what they said leads, and a question that names the wrong person still
    finds what was said near the top."""
    mixed, rest = [], iter(general)
    for start in range(0, len(said), SAID_PER_OTHER):
        mixed += said[start:start + SAID_PER_OTHER]
        mixed += itertools.islice(rest, 1)
    return mixed + list(rest)


def sent_by(hits: list[SearchHit], names: Sequence[str]) -> list[SearchHit]:
    """Those of HITS sent by someone one of NAMES (words of a question) names, case and
    diacritics aside ("caroline" names "Caroline Smith")."""
    people = [person for name in names if (person := set(folded_words(name)))]
    return [hit for hit in hits if any(
        person <= set(folded_words(who(hit.sender, hit.extra))) for person in people)]


def said_first(hits: list[SearchHit], names: Sequence[str]) -> list[SearchHit]:
    """HITS with what was sent by someone NAMES names leading, as `mix_named` mixes
    them (two for each other hit); HITS as they are when NAMES name none of them."""
    said = sent_by(hits, names)
    if not said:
        return hits
    kept = {hit.id for hit in said}
    return mix_named(said, [hit for hit in hits if hit.id not in kept])
