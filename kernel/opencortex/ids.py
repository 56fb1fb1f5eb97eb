"""Unique ids for turns, messages and summaries, without a system call each.

`uuid.uuid4()` reads the OS's random source every time: a system call, during
which a thread gives up the GIL and may wait to get it back behind every other
thread's Python work (under load, ~0.1 ms a call on the event loop).  These ids
need to be unique, not secret (what must be unguessable, the EPC secret, wire
token and approval ids, still comes from `secrets`/`uuid4`), so they come from
one generator per process, seeded from the OS's random source, and seeded anew
in a forked child so parent and child never share a sequence.
"""

from __future__ import annotations

import os
import random
import uuid

_generator = random.Random(os.urandom(32))


def _reseed() -> None:
    _generator.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def random_uuid() -> uuid.UUID:
    """A version-4 (random) UUID."""
    return uuid.UUID(int=_generator.getrandbits(128), version=4)
