"""The order of recall's lexical hits: a bonus for being newer, and what the people a
question names said leading the other matches."""

from __future__ import annotations

import itertools

from opencortex.memory import SearchHit

RECENCY_WEIGHT = 0.5           # "now": the newest candidate's score counts this much more
SAID_PER_OTHER = 2             # hits of what a named person said per other hit, in turn


def newer_first(hits: list[SearchHit]) -> list[SearchHit]:
    """HITS re-ranked with a bonus for being newer (up to RECENCY_WEIGHT of the score)."""
    if len(hits) < 2:
        return hits
    oldest = min(hit.timestamp for hit in hits)
    span = max(hit.timestamp for hit in hits) - oldest or 1.0
    return sorted(hits, key=lambda hit: -hit.score * (
        1 + RECENCY_WEIGHT * (hit.timestamp - oldest) / span))


def mix_named(said: list[SearchHit], general: list[SearchHit]) -> list[SearchHit]:
    """SAID (what the people named said) two at a time, then one of GENERAL, in their
    orders: what they said leads, and a question that names the wrong person still
    finds what was said near the top."""
    mixed, rest = [], iter(general)
    for start in range(0, len(said), SAID_PER_OTHER):
        mixed += said[start:start + SAID_PER_OTHER]
        mixed += itertools.islice(rest, 1)
    return mixed + list(rest)
