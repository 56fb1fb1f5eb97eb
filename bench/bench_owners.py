"""Many owners in one index (a script, not a test): prints figures, asserts nothing.

    python bench/bench_owners.py           # 3,000 chats of 3 messages
    python bench/bench_owners.py --quick   # 400 chats

Every Telegram, Signal or Matrix chat is an owner, and each owner once had FTS5
tables of its own: SQLite reads the whole schema on every new connection, at a
cost that grows faster than the number of tables.  Now the first OWN_TABLES
owners get their own and the rest share SHARED_TABLES (see `partitions`).

For each rule, the same JSON Lines file (N chats, 3 messages each) is imported
through the command's path (`import_history`), and the figures are: the import's
time, the schema objects of the index, the opening of a new connection (the
fastest of five), and a stranger's recall (p50 over 50 chats).  "one table per
owner" sets OWN_TABLES past N: the rule before.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from opencortex.conversation.recall import Recall
from opencortex.events import Thread
from opencortex.memory import Archive, partitions
from opencortex.memory_commands import import_history

WORDS = "apple river stone cloud violin garden rocket pepper lantern mirror".split()
START = 1_700_000_000


def write_chats(path: Path, chats: int) -> None:
    """CHATS Telegram chats of three messages each, one line per message."""
    with path.open("w", encoding="utf-8") as out:
        for n in range(chats):
            for m in range(3):
                out.write(json.dumps({
                    "thread": f"telegram:{100000 + n}", "role": "user" if m != 1 else "assistant",
                    "sender": f"person{n}" if m != 1 else None,
                    "timestamp": START + 21 * n + 7 * m,
                    "text": f"{WORDS[n % 10]} {WORDS[(n + m) % 10]} number{n} part{m}"}) + "\n")


def open_ms(index: Path) -> float:
    """The fastest of five openings of a new connection to INDEX (schema read), in ms."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        db = sqlite3.connect(index)
        db.execute("SELECT count(*) FROM files").fetchone()
        times.append(time.perf_counter() - started)
        db.close()
    return min(times) * 1e3


def measure(rule: str, own_tables: int, source: Path, chats: int, tmp: Path) -> None:
    partitions.OWN_TABLES = own_tables
    root = tmp / rule.replace(" ", "-")
    with Archive(root) as archive:
        started = time.perf_counter()
        report = import_history(archive, source, fmt="jsonl")
        seconds = time.perf_counter() - started
        recall = Recall(archive, {})
        times = []
        for n in range(0, chats, max(chats // 50, 1)):
            started = time.perf_counter()
            recall.recall(Thread("telegram", str(100000 + n)), f"what about number{n}?")
            times.append(time.perf_counter() - started)
    db = sqlite3.connect(root / "index.sqlite")
    objects = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    db.close()
    print(f"  {rule:<22} import {seconds:6.2f} s ({report.added / seconds:6,.0f} messages/s)"
          f"  schema objects {objects:>6,}  connection opens in "
          f"{open_ms(root / 'index.sqlite'):7.1f} ms  recall p50 {statistics.median(times) * 1e3:5.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="400 chats")
    args = parser.parse_args()
    chats = 400 if args.quick else 3_000
    shared = partitions.OWN_TABLES
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "chats.jsonl"
        write_chats(source, chats)
        print(f"{chats:,} chats of 3 messages; own tables for the first {shared} owners, "
              f"{partitions.SHARED_TABLES} shared")
        measure("one table per owner", chats + 1, source, chats, Path(tmp))
        measure("shared past the first", shared, source, chats, Path(tmp))


if __name__ == "__main__":
    main()
