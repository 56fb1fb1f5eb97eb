"""First load of a long thread (a script, not a test): prints figures, asserts nothing.

    python bench/bench_first_load.py            # a thread of 100k turns
    python bench/bench_first_load.py --quick    # 5k turns

The thread file is written directly in the archive's org format, as
`Conversations.record_turn` writes it (one write per turn: the user message
and the reply, the reply carrying TOKENS_IN/OUT, TURN and the checkpoint, which
says the working context starts CONTEXT_TURNS turns back), and indexed once.  Then a fresh `Conversations` opens the thread, several
times over: the figure is the p50 of that first open (thread log, session,
working context).  Target: < 0.3 s at 100k turns, flat with the length.
For comparison the whole replay (`ThreadLog.load`, what every open did
before checkpoints) is timed too, and so is a start that must summarize
(strategy summarize) against one that puts the kept summary back.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from opencortex.conversation.checkpoint import CHECKPOINT, Checkpoint, ContextMark
from opencortex.conversation.conversations import Conversations
from opencortex.conversation.settings import ConversationSettings
from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord
from opencortex.memory.orgformat import Part, render_entry, render_header

THREAD = Thread("cli", "bench")
RUNS = 5
START = 1.7e9
CONTEXT_TURNS = 150     # about what the default budget's context holds of these turns


def turn_records(number: int, parent: str | None, first: str | None, oldest: str | None
                 ) -> tuple[MessageRecord, MessageRecord]:
    """Turn NUMBER (1-based) after message PARENT, as record_turn would have written it
    (the context starting at message OLDEST)."""
    state = Checkpoint(head=parent, branch="main", turns=number - 1, tokens=(number - 1) * 120,
                       seen=parent, first=first, strategy=None, pins=frozenset(),
                       context=ContextMark(oldest=oldest))
    question = MessageRecord(
        id=str(uuid.uuid4()), role="user", channel=THREAD.channel, chat_id=THREAD.chat_id,
        text=f"question {number}: how does the kernel keep the plist archive and branch budget?",
        timestamp=START + number, parent=parent)
    answer = MessageRecord(
        id=str(uuid.uuid4()), role="assistant", channel=THREAD.channel,
        chat_id=THREAD.chat_id, timestamp=START + number + 0.5, parent=question.id,
        text=(f"answer {number}: the summary pressure decides; recall by owner and thread, "
              "then the emacs buffer streams tokens from the model."),
        extra={"TOKENS_IN": "100", "TOKENS_OUT": "20", "TURN": str(number),
               CHECKPOINT: state.render()})
    return question, answer


def build(root: Path, turns: int) -> None:
    """Write a thread of TURNS turns straight to its org file and index it."""
    archive = Archive(root)
    path = archive.thread_file(THREAD)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    chunks = [render_header(THREAD).encode("utf-8")]
    offset, entries, parent, first = len(chunks[0]), [], None, None
    for number in range(1, turns + 1):
        back = 2 * min(CONTEXT_TURNS, number - 1)
        oldest = entries[-back][1].id if back else None
        for part, record in enumerate(turn_records(number, parent, first, oldest), start=1):
            data = render_entry(record, Part(part, 2)).encode("utf-8")
            entries.append((offset, record))
            chunks.append(data)
            offset += len(data)
        first = first or entries[0][1].id
        parent = entries[-1][1].id
    path.write_bytes(b"".join(chunks))
    archive.replace_indexed(path, entries, offset)
    archive.close()


async def first_open(archive: Archive, settings: ConversationSettings) -> float:
    """Seconds a fresh Conversations takes to open the thread."""
    started = time.perf_counter()
    conversations = Conversations(archive, settings)
    await conversations.open(THREAD)
    return time.perf_counter() - started


def whole_replay(archive: Archive) -> float:
    started = time.perf_counter()
    ThreadLog.load(archive, THREAD)
    return time.perf_counter() - started


async def measure(turns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "memory"
        started = time.perf_counter()
        build(root, turns)
        built = time.perf_counter() - started
        with Archive(root) as archive:
            opens = [await first_open(archive, ConversationSettings()) for _ in range(RUNS)]
            replay = statistics.median(whole_replay(archive) for _ in range(3))
            summarize = ConversationSettings(strategy="summarize", budget=2000)
            making = await first_open(archive, summarize)     # no summary kept yet: makes one
            reusing = [await first_open(archive, summarize) for _ in range(RUNS)]
            size = archive.thread_file(THREAD).stat().st_size / 1e6
        print(f"  {turns:>7,} turns ({size:5.1f} MB, {built:4.1f} s to build): first open p50 "
              f"{statistics.median(opens) * 1e3:7.1f} ms (target < 300 ms) | whole replay "
              f"(the old open's log) {replay * 1e3:7.1f} ms | summarize: first start "
              f"{making * 1e3:6.1f} ms, later starts p50 {statistics.median(reusing) * 1e3:6.1f}"
              " ms (kept summary reused)")


async def main(quick: bool) -> None:
    print("first open of a thread after a start (fresh Conversations, p50 of "
          f"{RUNS} runs):")
    for turns in ([500, 5_000] if quick else [5_000, 100_000]):
        await measure(turns)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    asyncio.run(main(parser.parse_args().quick))
