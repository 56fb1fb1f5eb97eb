"""`ids.random_uuid`: unique version-4 ids without a system call each."""

from __future__ import annotations

import os
import uuid

from opencortex.ids import random_uuid
from opencortex.turn import new_turn_id


def test_ids_are_version_4_and_do_not_repeat():
    ids = [random_uuid() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert all(i.version == 4 and i.variant == uuid.RFC_4122 for i in ids[:1000])
    assert len({new_turn_id() for _ in range(10_000)}) == 10_000


def test_a_forked_child_does_not_repeat_its_parents_ids():
    read, write = os.pipe()
    child = os.fork()
    if child == 0:                                     # the child: one id, then out
        os.write(write, random_uuid().bytes)
        os._exit(0)
    os.close(write)
    try:
        theirs = os.read(read, 16)
    finally:
        os.close(read)
        os.waitpid(child, 0)
    assert theirs != random_uuid().bytes
