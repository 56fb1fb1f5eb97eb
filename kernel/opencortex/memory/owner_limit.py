"""How many owners a JSON Lines import would leave the index with, counted before it writes.

Each owner (see `conversation.recall.owner_of`: the name `[conversation] owners`
gives a thread, "local" for Emacs and terminal threads, else the thread itself,
so that every Telegram, Signal or Matrix chat is an owner of its own) has FTS5
tables of its own in the index (see `partitions`).  SQLite makes a schema change,
and every opening of the index, cost time per schema object: importing 1,000
threads took 7.4 s, 2,000 took 28.7 s, and with about 9,650 owners every later
command took 36-50 s.  So an import that would leave the index with more than
MAX_OWNERS owners is refused before anything is written, unless asked for
(`--many-owners`).

The count streams the file (a pipe is spooled first, see `ImportSource.rewind`)
and keeps only the names of the new owners, and stops once they are too many.
Lines that cannot be read are passed over here: the import reports them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import BinaryIO

from opencortex.events import Thread
from opencortex.memory.importer import BadMessage, ImportFailed, jsonl_values, line_thread
from opencortex.memory.partitions import Partition

# Owners (each with its own FTS5 tables) an import may leave the index with: past
# about a thousand, every start of opencortex (every opening of the index) slows
# down by seconds, and more with every further owner.
MAX_OWNERS = 1000


def new_owners(stream: BinaryIO, default_thread: Thread | None, partition: Partition,
               known: Collection[str], room: int) -> set[str]:
    """The owners (as PARTITION names them) of the threads of STREAM's JSON lines that
    are not among KNOWN, collected until there are more than ROOM of them."""
    found: set[str] = set()
    for _, data in jsonl_values(stream):
        if not isinstance(data, dict):            # a Problem too: the import reports it
            continue
        try:
            thread = line_thread(data, default_thread)
        except (BadMessage, ValueError):
            continue
        if thread is None:
            continue
        owner = partition(thread)
        if owner not in known and owner not in found:
            found.add(owner)
            if len(found) > room:
                break
    return found


def check_owners(stream: BinaryIO, default_thread: Thread | None, partition: Partition,
                 known: Collection[str]) -> None:
    """Refuse (ImportFailed) the JSON Lines file STREAM when its threads would leave the
    index with more than MAX_OWNERS owners, KNOWN being those it has."""
    room = max(MAX_OWNERS - len(known), 0)
    found = new_owners(stream, default_thread, partition, known, room)
    if len(found) > room:
        raise ImportFailed(
            f"nothing was imported: the file's threads belong to more than {room} owners "
            f"the memory index does not have yet (it has {len(known)}); every Telegram, "
            "Signal or Matrix chat is an owner of its own unless [conversation] owners "
            f"names it, and past {MAX_OWNERS} owners every start of opencortex slows down. "
            "Pass --many-owners to import it anyway")
