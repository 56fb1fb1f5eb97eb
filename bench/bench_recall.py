"""Benchmark figures for recall (a script, not a test): prints, asserts nothing.

    python bench/bench_recall.py              # 10k and 100k archived messages
    python bench/bench_recall.py --million    # also 1M (takes several minutes, ~1 GB disk)
    python bench/bench_recall.py --quick      # a few seconds: 10k only, 50 queries

The archive holds synthetic messages: a Zipf-distributed vocabulary of 50k words
plus English function words, over 300 threads of which 30 belong to the local
owner (Emacs and terminal) and the rest to Telegram users and groups.  Queries
are chat-like sentences (function words, a few common and a few rare words).

Figures: p50 / p95 / max of `Recall.recall` (k=5) for the local owner and for a
single Telegram user (targets: p95 <= 10 ms at 100k, <= 50 ms at 1M), for the local
owner asking about a period nothing was said in ("... last month"), and of an
unscoped `Archive.search` with only very common words (the guarded case); and
recall for one owner as the number of its threads grows (30, 1,000, 5,000 threads
holding 20k messages): it should not grow with them.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opencortex.conversation.recall import SETTLE_NS, Recall
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

VOCABULARY = [f"w{i}" for i in range(50_000)]
FUNCTION_WORDS = "the a is to and of it you that in what how do we i".split()
CUM_WEIGHTS = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))
THREADS = ([Thread("emacs", f"chat{i}") for i in range(20)]
           + [Thread("cli", f"term{i}") for i in range(10)]
           + [Thread("telegram", str(1000 + i)) for i in range(250)]
           + [Thread("telegram", str(-100 - i)) for i in range(20)])


def sentence(rng: random.Random, words: int = 12) -> str:
    picked = rng.choices(VOCABULARY, cum_weights=CUM_WEIGHTS, k=words)
    picked += rng.sample(FUNCTION_WORDS, 5)
    rng.shuffle(picked)
    return " ".join(picked)


def fill(archive: Archive, total: int, rng: random.Random) -> None:
    """Archive TOTAL messages in batches of 1,000, one thread per batch."""
    batch = 1000
    for start in range(0, total, batch):
        thread = rng.choice(THREADS)
        archive.append([NewMessage(role="user" if i % 2 == 0 else "assistant",
                                   text=sentence(rng), thread=thread)
                        for i in range(start, min(start + batch, total))])


def figures(label: str, times: list[float]) -> str:
    times = sorted(times)
    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
    return (f"  {label:<38} p50 {statistics.median(times) * 1e3:7.3f} ms   "
            f"p95 {p95 * 1e3:7.3f} ms   max {times[-1] * 1e3:7.3f} ms")


def timed(call, queries: list[str]) -> list[float]:
    times = []
    for query in queries:
        started = time.perf_counter()
        call(query)
        times.append(time.perf_counter() - started)
    return times


def bench(size: int, count: int = 300) -> None:
    rng = random.Random(size)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Archive(Path(tmp))
        started = time.perf_counter()
        fill(archive, size, rng)
        filled = time.perf_counter() - started
        recall = Recall(archive, {})
        queries = [sentence(rng, words=6) for _ in range(count)]
        time.sleep(SETTLE_NS / 1e9)              # let the directory times settle (see Recall)
        recall.recall(THREADS[0], queries[0])    # read the thread list once
        print(f"at {size:,} archived messages (fill took {filled:.1f} s)")
        print(figures("recall, local owner (30 threads)",
                      timed(lambda q: recall.recall(THREADS[0], q, k=5), queries)))
        print(figures("recall, one Telegram user",
                      timed(lambda q: recall.recall(THREADS[40], q, k=5), queries)))
        print(figures("recall, a period nothing was said in",   # all was said today
                      timed(lambda q: recall.recall(THREADS[0], f"{q} last month", k=5),
                            queries)))
        common = [" ".join(rng.sample(FUNCTION_WORDS, 3)) for _ in range(max(1, count // 3))]
        print(figures("search, function words only, all",
                      timed(lambda q: archive.search(q, limit=5), common)))
        archive.close()


def bench_threads(total: int, counts: list[int], queries_n: int) -> None:
    """Recall for one owner whose TOTAL messages are spread over each of COUNTS threads
    (years of Emacs chats): the cost should not grow with the number of threads."""
    print(f"recall, local owner, {total:,} messages spread over N of its threads")
    for count in counts:
        rng = random.Random(count)
        threads = [Thread("emacs", f"chat{i}") for i in range(count)]
        with tempfile.TemporaryDirectory() as tmp:
            archive = Archive(Path(tmp))
            for start in range(0, total, 1000):
                archive.append([NewMessage(role="user", text=sentence(rng),
                                           thread=threads[i % count])
                                for i in range(start, min(start + 1000, total))])
            recall = Recall(archive, {})
            queries = [sentence(rng, words=6) for _ in range(queries_n)]
            time.sleep(SETTLE_NS / 1e9)
            recall.recall(threads[0], queries[0])
            print(figures(f"N = {count:,} threads",
                          timed(lambda q: recall.recall(threads[0], q, k=5), queries)))
            archive.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--million", action="store_true", help="also measure at 1M messages")
    parser.add_argument("--quick", action="store_true", help="10k messages, 50 queries")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}")
    sizes = [10_000] if args.quick else [10_000, 100_000]
    for size in sizes + ([1_000_000] if args.million else []):
        bench(size, 50 if args.quick else 300)
    if args.quick:
        bench_threads(2_000, [30, 1_000], 30)
    else:
        bench_threads(20_000, [30, 1_000, 5_000], 300)


if __name__ == "__main__":
    main()
