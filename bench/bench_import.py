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

Then two runs of `opencortex memory import` itself, each in a child process
whose own peak resident memory is shown (the kernel it runs is the one on
PYTHONPATH): all the messages in ONE thread (its checkpoint used to replay the
thread: about 300 MB per 100k messages), and the export of a private chat the
Telegram bridge archived already (half the messages, the bot's replies among
them; the other half came before the bridge), which must add only that half.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory.rows import PLATFORM_ID, SENDER_NAME
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


# The command, saying its own peak resident memory as it exits: VmHWM is its own, where
# the ru_maxrss of a child keeps the peak of the (large) process that started it.
COMMAND = """
import atexit, sys
def peak():
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"peak-kB {kb}", file=sys.stderr)
atexit.register(peak)
from opencortex.cli import main
sys.exit(main(sys.argv[1:]))
"""


def command(home: Path, path: Path) -> tuple[float, float, str]:
    """(seconds, peak resident MB, first lines of output) of `opencortex memory import
    PATH` run on HOME in a child process (Linux: its peak read from /proc)."""
    env = {**os.environ, "OPENCORTEX_HOME": str(home)}
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", COMMAND, "memory", "import", str(path)],
                         env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    peak = next((int(line.split()[1]) / 1024 for line in run.stderr.splitlines()
                 if line.startswith("peak-kB ")), float("nan"))
    return seconds, peak, " / ".join(run.stdout.strip().splitlines()[:2])


def one_thread(count: int, tmp: Path, rng: random.Random) -> None:
    """COUNT JSON Lines messages of one thread, imported by the command."""
    path = tmp / "one-thread.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for n in range(count):
            out.write(json.dumps({"thread": "telegram:4242",
                                  "role": "user" if n % 2 == 0 else "assistant",
                                  "sender": "alice" if n % 2 == 0 else None,
                                  "timestamp": START + 7 * n, "text": sentence(rng)}) + "\n")
    seconds, peak, _ = command(tmp / "home-one", path)
    print(figure("one thread (the command)", count, seconds) + f"  peak {peak:.0f} MB")


def bridged_chat(count: int, tmp: Path, rng: random.Random) -> None:
    """A private chat of COUNT messages whose newer half the bridge archived (turns: a
    person's message stamped 0.4 s after Telegram's time, the reply 1.3 s after),
    exported and imported by the command."""
    thread, half = Thread("telegram", "555"), count // 2
    said = [(sentence(rng), START + 10 * n) for n in range(count)]
    with Archive(tmp / "home-bridged" / "memory") as archive:
        for first in range(half, count, 1000):          # a turn per pair, written in batches
            archive.append([
                NewMessage(role="user", text=text, thread=thread, sender="2",
                           timestamp=at + 0.4, extra={PLATFORM_ID: str(n), SENDER_NAME: "Bob"})
                if n % 2 == 0 else
                NewMessage(role="assistant", text=text, thread=thread, timestamp=at + 1.3)
                for n, (text, at) in enumerate(said[first:first + 1000], start=first)])
    path = tmp / "bridged-result.json"
    with path.open("w", encoding="utf-8") as out:
        out.write('{\n "name": "Bob", "type": "personal_chat", "id": 555,\n "messages": [\n')
        for n, (text, at) in enumerate(said):
            who = ("Bob", "user2") if n % 2 == 0 else ("Helper", "user999")
            message = {"id": n + 1, "type": "message", "date": "2020-09-13T12:26:40",
                       "date_unixtime": str(at), "from": who[0], "from_id": who[1],
                       "text": text, "text_entities": []}
            out.write(("  " if n == 0 else ",\n  ") + json.dumps(message))
        out.write("\n ]\n}\n")
    seconds, peak, output = command(tmp / "home-bridged", path)
    print(figure("chat the bridge archived half of", count, seconds) + f"  peak {peak:.0f} MB")
    print(f"    {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 messages")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}")
    count = 2_000 if args.quick else 100_000
    bench(count)
    with tempfile.TemporaryDirectory() as tmp:
        one_thread(count, Path(tmp), random.Random(1))
        bridged_chat(count, Path(tmp), random.Random(2))


if __name__ == "__main__":
    main()
