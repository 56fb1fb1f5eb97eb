"""Start to first answer when the index is behind the org files (a script, not a test).

    python bench/bench_start_behind.py           # threads of 100k messages
    python bench/bench_start_behind.py --quick   # 4k messages

A home holds one long thread, written either by `memory import` (1,000
messages per write, ~390 KB: longer than a chunk of the catch-up) or as the
kernel writes turns (a question and a reply with its checkpoint per write; see
bench_first_load).  Each case copies the home, changes it, then builds a kernel
(as `chat` and `serve` do) and has it answer one message in another thread:
the figure is the seconds from `build_kernel` to that answer.  The catch-up
goes on in the background; the seconds it took to end are printed too.  Cases:
- up to date: nothing to catch up (the floor);
- typo: one byte added in the middle of the thread file, by hand;
- checkpoints removed: every :CHECKPOINT: line deleted (kernel-written only);
- index lost: index.sqlite removed.
Target: the first answer within well under a second in every case (a hand edit
or a lost index used to hold the start 15-30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

from bench_first_load import build
from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.memory import Archive
from opencortex.memory_commands import import_history
from opencortex.runtime import build_kernel

WORDS = [f"w{i}" for i in range(5000)] + "the a is to and of".split()
WAIT = 600.0            # seconds a catch-up may take at most


def imported(home: Path, messages: int) -> Path:
    """HOME with one thread of MESSAGES messages, written by `memory import`."""
    rng = random.Random(messages)
    source = home.parent / f"{home.name}.jsonl"
    with source.open("w", encoding="utf-8") as out:
        for n in range(messages):
            out.write(json.dumps({"thread": "cli:big", "role": "user" if n % 2 else "assistant",
                                  "timestamp": 1.6e9 + 7 * n,
                                  "text": " ".join(rng.choices(WORDS, k=rng.randint(5, 30)))})
                      + "\n")
    with Archive(home / "memory") as archive:
        import_history(archive, source, fmt="jsonl")
    return home


def kernel_written(home: Path, messages: int) -> Path:
    """HOME with one thread of MESSAGES messages, written as the kernel writes turns."""
    build(home / "memory", messages // 2)
    return home


def typo(memory: Path) -> None:
    path = thread_file(memory)
    data = path.read_bytes()
    middle = data.index(b" w", len(data) // 2) if b" w" in data[len(data) // 2:] else \
        data.index(b" the", len(data) // 2)
    path.write_bytes(data[:middle] + b" x" + data[middle + 1:])


def no_checkpoints(memory: Path) -> None:
    path = thread_file(memory)
    path.write_bytes(re.sub(rb"(?m)^:CHECKPOINT: .*\n", b"", path.read_bytes()))


def lost_index(memory: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (memory / f"index.sqlite{suffix}").unlink(missing_ok=True)


def thread_file(memory: Path) -> Path:
    return next(path for path in memory.glob("*/*.org"))


CASES = {"up to date": None, "typo": typo, "checkpoints removed": no_checkpoints,
         "index lost": lost_index}


async def first_answer(home: Path) -> tuple[float, float]:
    """Seconds from building a kernel on HOME to its first answer, and to the end of
    the catch-up it left to the background."""
    started = time.perf_counter()
    kernel = build_kernel(load_config(home), writer=lambda text: None)
    try:
        await kernel.start()
        result = await kernel.handle(chat_message("hello", "cli", "other"))
        answered = time.perf_counter() - started
        assert result.status == "done", result
        kernel.archive.wait_indexed(WAIT)
        return answered, time.perf_counter() - started
    finally:
        await kernel.aclose()


async def main(quick: bool) -> None:
    messages = 4_000 if quick else 100_000
    print(f"start to first answer with the index behind the org files ({messages:,} messages "
          "in one thread; target: well under 1 s):")
    with tempfile.TemporaryDirectory() as tmp:
        for label, make in (("memory import", imported), ("kernel turns", kernel_written)):
            home = Path(tmp) / label.replace(" ", "-")
            home.mkdir()
            make(home, messages)
            size = thread_file(home / "memory").stat().st_size / 1e6
            for case, change in CASES.items():
                if change is no_checkpoints and make is imported:
                    continue
                copy = Path(tmp) / "copy"
                shutil.copytree(home, copy)
                if change is not None:
                    change(copy / "memory")
                answered, caught_up = await first_answer(copy)
                print(f"  {label:<13} ({size:5.1f} MB) {case:<20} first answer "
                      f"{answered:6.2f} s | index caught up after {caught_up:6.1f} s")
                shutil.rmtree(copy)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    asyncio.run(main(parser.parse_args().quick))
