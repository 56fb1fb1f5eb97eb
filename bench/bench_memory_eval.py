"""Recall quality and speed on a generated multi-session chat (a script: prints, asserts nothing).

    python bench/bench_memory_eval.py            # 40 sessions + 100k-message scale figures
    python bench/bench_memory_eval.py --quick    # a few seconds: 12 sessions, no scale run
    python bench/bench_memory_eval.py --embedder python:mymodels.embed:embed
                                                 # also the ranking fused with a local model

The dataset (see memory_eval_data.py) is archived through the kernel's own
path (`Archive.append`, org files + index); the questions are asked in a new
thread of the same owner through `Conversations.recall`, as a turn would.
Other owners' (larger) chats share the archive: they must never be recalled
and they skew whole-archive word statistics.

Figures: R@5 and R@10 (a question counts when a message holding its answer,
or one of the same words, is among what recall brings with k=5 / k=10: the K
best and the question or reply next to each, as a turn gets them; how many
were found only beside the K best is printed too) overall and per question kind,
recall latency p50 / p95 (of the k=10 recall; per kind its p50 and slowest, so one
slow kind of question stands out); without --quick also the same at 100k
messages of one owner, the first load of a 100k-turn thread (as written, and
with the checkpoint `memory import` leaves), and the import rate.

With --embedder SPEC (a `[memory.embeddings] model`: "python:module:function"
or "sentence-transformers:/local/dir"), every message of the owner is
embedded first (the rate is printed), then the same questions are asked of
the lexical ranking fused with the model's (reciprocal rank fusion).  The
figures are the model's: the test suite runs this only with a toy embedder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_eval_data import Dataset, Turn, generate  # noqa: E402
from memory_eval_kinds import plant_hard_kinds  # noqa: E402

from opencortex.conversation.conversations import Conversations, checkpoint_threads  # noqa: E402
from opencortex.conversation.dense import DenseRecall  # noqa: E402
from opencortex.conversation.recall import SETTLE_NS  # noqa: E402
from opencortex.conversation.settings import ConversationSettings  # noqa: E402
from opencortex.events import Thread  # noqa: E402
from opencortex.memory import Archive, NewMessage  # noqa: E402
from opencortex.memory.embedding_settings import EmbeddingSettings  # noqa: E402

ASKING = Thread("emacs", "questions")     # a new thread of the local owner
BIG = Thread("emacs", "long-history")     # the 100k-message thread of the scale run
SMALL_TALK_WORDS = ("well ok so yes no maybe great thanks lol sure fine nice really good "
                    "later tomorrow weekend dinner coffee work tired busy").split()


def archive_turns(archive: Archive, thread: Thread, turns: list[Turn],
                  pair: tuple[str, ...]) -> dict[int, str]:
    """Append TURNS to THREAD (batches of 500); returns generated key -> record id."""
    ids = {}
    for start in range(0, len(turns), 500):
        chunk = turns[start:start + 500]
        records = archive.append([NewMessage(
            role="user" if t.sender == pair[0] else "assistant", text=t.text, thread=thread,
            sender=t.sender, timestamp=t.timestamp) for t in chunk])
        ids.update((t.key, r.id) for t, r in zip(chunk, records))
    return ids


def load(archive: Archive, data: Dataset) -> dict[int, str]:
    """Archive the owner's sessions and the other owners' chats."""
    ids: dict[int, str] = {}
    for index, session in enumerate(data.sessions):
        pair = tuple(dict.fromkeys(t.sender for t in session))
        ids.update(archive_turns(archive, Thread("emacs", f"session-{index}"), session, pair))
    for index, chat in enumerate(data.others):
        archive_turns(archive, Thread("telegram", str(5000 + index)), chat, (chat[0].sender,))
    return ids


def percentile(times: list[float], share: float) -> float:
    times = sorted(times)
    return times[min(len(times) - 1, int(len(times) * share))]


def recalled(conversations: Conversations, query: str, k: int, said: dict[str, str]
             ) -> tuple[list[str | None], list[str | None]]:
    """The texts recall brings for QUERY with K: the K best, and what came beside them."""
    entries = conversations.recall.recall(ASKING, query, k=k)
    texts = [said.get(entry.id) for entry in entries]       # the same words count alike
    best = sum(1 for entry in entries if ", next to a recalled message]" not in entry.text)
    return texts[:best], texts[best:]


def evaluate(conversations: Conversations, data: Dataset, ids: dict[int, str],
             label: str) -> None:
    """Ask every question; print R@5 / R@10 per kind and the recall latency."""
    found: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    beside_only = [0, 0]    # questions answered only by a message brought beside the K best
    times = []
    took: dict[str, list[float]] = defaultdict(list)    # recall latency by question kind
    said = {ids[turn.key]: turn.text for session in data.sessions for turn in session}
    for question in data.questions:
        wanted = {said[ids[key]] for key in question.evidence}
        started = time.perf_counter()
        ten = recalled(conversations, question.text, 10, said)
        times.append(time.perf_counter() - started)
        took[question.kind].append(times[-1])
        took["overall"].append(times[-1])
        five = recalled(conversations, question.text, 5, said)   # what a turn recalls
        hit = tuple(bool(wanted & set(best + beside)) for best, beside in (five, ten))
        for n, (best, _) in enumerate((five, ten)):
            beside_only[n] += hit[n] and not wanted & set(best)
        found[question.kind].append(hit)
        found["overall"].append(hit)
    print(f"{label}: {len(data.questions)} questions")
    for kind in ["overall", *sorted(k for k in found if k != "overall")]:
        rows = found[kind]
        r5 = sum(a for a, _ in rows) / len(rows)
        r10 = sum(b for _, b in rows) / len(rows)
        taken = took[kind]
        print(f"  {kind:<10} n={len(rows):<4} R@5 {r5:.3f}   R@10 {r10:.3f}   recall p50 "
              f"{statistics.median(taken) * 1e3:5.2f} ms, slowest {max(taken) * 1e3:6.2f}")
    print(f"  found only beside the K best: {beside_only[0]} at 5, {beside_only[1]} at 10")
    print(f"  recall latency   p50 {statistics.median(times) * 1e3:.2f} ms   "
          f"p95 {percentile(times, 0.95) * 1e3:.2f} ms")


def pad(archive: Archive, total: int, now: float) -> None:
    """Fill one thread of the owner up to TOTAL messages of small talk (older than the data)."""
    import random
    rng = random.Random(7)
    names = ("Caroline", "Melanie", "Dev", "Priya")
    batch = 1000
    for start in range(0, total, batch):
        archive.append([NewMessage(
            role="user" if i % 2 == 0 else "assistant", thread=BIG, sender=names[i % 4],
            text=f"{names[(i + 1) % 4]} " + " ".join(rng.choices(SMALL_TALK_WORDS, k=8)),
            timestamp=now - 400 * 86400 + i * 60) for i in range(start, min(start + batch, total))])


def fused(archive: Archive, settings: ConversationSettings, dense: DenseRecall
          ) -> Conversations:
    """Conversations whose recall fuses DENSE's ranking, every vector made first (those
    missing: the model is loaded once for the run)."""
    conversations = Conversations(archive, settings)
    conversations.recall.dense = dense
    scope = conversations.recall.scope(ASKING)
    started, made = time.perf_counter(), 0
    while count := dense.fill(scope):
        made += count
    elapsed = time.perf_counter() - started
    print(f"embedded {made:,} messages with {dense.model} in {elapsed:.1f} s "
          f"({made / max(elapsed, 1e-9):,.0f} messages/s)")
    return conversations


async def first_load(root: Path, settings: ConversationSettings) -> float:
    """Seconds to open BIG for the first time after a restart (fresh archive handle)."""
    with Archive(root) as archive:
        conversations = Conversations(archive, settings)
        started = time.perf_counter()
        await conversations.open(BIG)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small dataset, no scale run")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--scale", type=int, default=100_000,
                        help="owner messages for the scale run (default 100k)")
    parser.add_argument("--embedder", metavar="SPEC",
                        help="also measure recall fused with this local embedding model")
    args = parser.parse_args()
    now = time.time()
    if args.quick:
        data = generate(args.seed, sessions=12, per_session=50, facts=26, others=4,
                        other_size=300, now=now)
        data = plant_hard_kinds(data, args.seed, reworded=11, replies=7)
    else:
        data = generate(args.seed, sessions=40, per_session=120, facts=102, others=20,
                        other_size=1000, now=now)
        data = plant_hard_kinds(data, args.seed, reworded=22, replies=14)
    settings = ConversationSettings()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with Archive(root) as archive, contextlib.ExitStack() as closing:
            dense = None
            if args.embedder:
                dense = DenseRecall(archive, EmbeddingSettings(model=args.embedder, batch=1000))
                closing.callback(dense.close)
            started = time.perf_counter()
            ids = load(archive, data)
            elapsed = time.perf_counter() - started
            owner = sum(len(s) for s in data.sessions)
            print(f"python {sys.version.split()[0]}; {owner:,} owner messages in "
                  f"{len(data.sessions)} sessions, {sum(len(o) for o in data.others):,} "
                  f"of other owners; archived in {elapsed:.1f} s")
            time.sleep(SETTLE_NS / 1e9)     # let directory times settle (see Recall._refresh)
            evaluate(Conversations(archive, settings), data, ids, "evaluation")
            if dense is not None:
                evaluate(fused(archive, settings, dense), data, ids,
                         f"fused with {args.embedder}")
            if args.quick:
                return
            started = time.perf_counter()
            pad(archive, args.scale - owner, now)
            elapsed = time.perf_counter() - started
            print(f"padded to {args.scale:,} owner messages in {elapsed:.1f} s "
                  f"({(args.scale - owner) / elapsed:,.0f} messages/s through Archive.append)")
            evaluate(Conversations(archive, settings), data, ids, f"at {args.scale:,} messages")
            if dense is not None:
                evaluate(fused(archive, settings, dense), data, ids,
                         f"at {args.scale:,} messages, fused with {args.embedder}")
        seconds = asyncio.run(first_load(root, settings))
        print(f"first load of a {args.scale - owner:,}-message thread written without "
              f"checkpoints: {seconds:.2f} s")
        with Archive(root) as archive:
            started = time.perf_counter()
            checkpoint_threads(archive, [BIG])
            sealing = time.perf_counter() - started
        seconds = asyncio.run(first_load(root, settings))
        print(f"  with the checkpoint `memory import` writes at its end (took {sealing:.2f} s): "
              f"{seconds:.3f} s")


if __name__ == "__main__":
    main()
