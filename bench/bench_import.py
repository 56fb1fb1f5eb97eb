"""Benchmark figures for `memory import` (a script, not a test): prints, asserts nothing.

    python bench/bench_import.py           # 100k messages (target: >= 2,000 messages/s)
    python bench/bench_import.py --quick   # a few seconds: 2,000 messages

Files are generated in a temporary directory: JSON Lines over 50 threads whose
lines interleave (the hard case for batching per thread), and a Telegram
Desktop export of one chat with entity lists in a third of its messages.
Each import is the command's: `import_file`, then a checkpoint at the end of
every long thread it filled (see `checkpoint_threads`).
Figures: messages/s for a first import of each, messages/s for importing the
JSON Lines file again (everything is a duplicate, nothing is written), and the
process's peak resident memory (the import streams: it should not grow with
the file).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from opencortex.memory import Archive
from opencortex.memory_commands import import_history

WORDS = [f"w{i}" for i in range(20_000)] + "the a is to and of it you that in".split()
THREADS = ([f"telegram:{1000 + i}" for i in range(40)] + [f"cli:notes{i}" for i in range(10)])
START = 1_600_000_000


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(5, 30)))


def write_jsonl(path: Path, count: int, rng: random.Random) -> None:
    """COUNT messages over THREADS, lines interleaved, one every 7 seconds."""
    with path.open("w", encoding="utf-8") as out:
        for n in range(count):
            out.write(json.dumps({"thread": rng.choice(THREADS),
                                  "role": "user" if n % 2 == 0 else "assistant",
                                  "sender": "alice" if n % 2 == 0 else None,
                                  "timestamp": START + 7 * n, "text": sentence(rng)}) + "\n")


def write_telegram(path: Path, count: int, rng: random.Random) -> None:
    """A Telegram Desktop export of one supergroup with COUNT messages."""
    with path.open("w", encoding="utf-8") as out:
        out.write('{\n "name": "Bench",\n "type": "private_supergroup",\n "id": 777,\n'
                  ' "messages": [\n')
        for n in range(count):
            text = sentence(rng)
            if n % 3 == 0:
                text = ["see ", {"type": "bold", "text": text}, " here"]
            message = {"id": n + 1, "type": "message", "date": "2020-09-13T12:26:40",
                       "date_unixtime": str(START + 11 * n), "from": f"Person {n % 5}",
                       "from_id": f"user{n % 5}", "text": text, "text_entities": []}
            out.write(("  " if n == 0 else ",\n  ") + json.dumps(message, indent=1))
        out.write("\n ]\n}\n")


def timed_import(archive: Archive, path: Path, fmt: str) -> tuple[float, object]:
    started = time.perf_counter()
    report = import_history(archive, path, fmt=fmt)
    return time.perf_counter() - started, report


def figure(label: str, count: int, seconds: float) -> str:
    return f"  {label:<34} {count:>8,} messages  {seconds:6.2f} s  {count / seconds:9,.0f} messages/s"


def bench(count: int) -> None:
    rng = random.Random(count)
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, export = Path(tmp) / "history.jsonl", Path(tmp) / "result.json"
        write_jsonl(jsonl, count, rng)
        write_telegram(export, count, rng)
        print(f"{count:,} messages per file (JSON Lines {jsonl.stat().st_size / 1e6:.1f} MB, "
              f"Telegram export {export.stat().st_size / 1e6:.1f} MB)")
        with Archive(Path(tmp) / "memory") as archive:
            seconds, report = timed_import(archive, jsonl, "jsonl")
            print(figure("JSON Lines, 50 threads interleaved", report.added, seconds))
            seconds, report = timed_import(archive, jsonl, "auto")
            print(figure("the same file again (duplicates)", report.duplicates, seconds))
            seconds, report = timed_import(archive, export, "auto")
            print(figure("Telegram export, one chat", report.added, seconds))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  peak resident memory {peak:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 messages")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}")
    bench(2_000 if args.quick else 100_000)


if __name__ == "__main__":
    main()
