"""SIGKILL a served kernel (and its archive writer process, if any) under EPC load, then check
the archive (issue 14; a script, not a test): every reply a client saw is archived
exactly once, with its message, and no message or reply is there twice or in part.

    python bench/bench_crash.py             # 10 rounds, 10 clients
    python bench/bench_crash.py --quick     # 2 rounds
    python bench/bench_crash.py --tree /tmp/before

Each round serves a new home, drives CLIENTS clients (each sends its next message
when the reply to the previous one came), kills the kernel and its children with
SIGKILL after a random number of replies, opens the archive as the next start
would (a torn write is moved aside) and counts: replies seen but not archived
(lost), messages or replies archived twice (duplicated), turns archived without
their reply or the reverse (partial).  All must be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from load_clients import Counts, ServedKernel, TOKEN, connect_all


def kill_tree(pid: int) -> None:
    """SIGKILL PID's children (the archive writer process), then PID, at once."""
    children = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children += [int(child) for child in listing.read_text().split()]
        except FileNotFoundError:
            pass
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(pid, signal.SIGKILL)


async def drive_until_killed(served: ServedKernel, clients_n: int, kill_after: int
                             ) -> tuple[set[str], int]:
    """The tokens of the replies seen before the kill, and the errors counted."""
    counts = Counts()
    clients = await connect_all(served.port, served.secret(), clients_n, counts)
    seen: set[str] = set()

    async def drive(client) -> None:
        while True:
            turn = client.send()
            try:
                await asyncio.wait_for(turn.done.wait(), 30)
            except asyncio.TimeoutError:
                return
            seen.add(TOKEN.search(turn.text).group(0))

    tasks = [asyncio.create_task(drive(client)) for client in clients]
    deadline = time.monotonic() + 60
    while len(seen) < kill_after and time.monotonic() < deadline:
        await asyncio.sleep(0.0005)
    kill_tree(served.process.pid)
    replied = set(seen)     # what was seen before the kill; later replies cannot come
    served.process.wait(timeout=20)
    for task in tasks:
        task.cancel()
    for client in clients:
        await client.close()
    return replied, counts.errors


def audit(home: Path, replied: set[str]) -> dict[str, int]:
    from opencortex.memory import Archive
    archive = Archive(home / "memory")
    try:
        messages: Counter[str] = Counter()
        answers: Counter[str] = Counter()
        for thread in archive.threads():
            for record in archive.read_thread(thread):
                found = TOKEN.search(record.text)
                if found:
                    (messages if record.role == "user" else answers)[found.group(0)] += 1
    finally:
        archive.close()
    return {"replied": len(replied),
            "lost": sum(1 for token in replied if answers[token] == 0),
            "duplicated": sum(1 for counter in (messages, answers)
                              for count in counter.values() if count > 1),
            "partial": sum(1 for t in set(messages) | set(answers)
                           if messages[t] != answers[t])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--tree", type=Path, help="serve the kernel of this checkout")
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    rng = random.Random(args.seed)
    totals: Counter[str] = Counter()
    for number in range(rounds):
        with tempfile.TemporaryDirectory(prefix="oc-crash-") as root:
            served = ServedKernel(Path(root), args.tree)
            try:
                replied, errors = asyncio.run(
                    drive_until_killed(served, args.clients, rng.randrange(20, 400)))
            finally:
                if served.process.poll() is None:
                    kill_tree(served.process.pid)
                served.process.wait(timeout=20)
                served.process.stdout.close()
                served.stderr.close()
            figures = audit(Path(root) / "home", replied)
            figures["calls cut by the kill"] = errors
            totals.update(figures)
            print(f"round {number + 1}: " + ", ".join(f"{k} {v}" for k, v in figures.items()),
                  flush=True)
    print("total: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    if totals["lost"] or totals["duplicated"] or totals["partial"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
