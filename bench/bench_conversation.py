"""Conversation benchmark (a script, not a test): prints figures, asserts nothing.

    python bench/bench_conversation.py            # threads of 100, 10k and 100k turns
    python bench/bench_conversation.py --quick    # 100 and 10k only

Figures:
- context assembly per turn (the working context of the thread's branch handed
  to the chat skill, and the prompt it builds) for threads of 100, 10k and 100k
  turns, p50 / p99 — target < 5 ms at 100k and flat with history length; recall
  for the same turn (same-owner FTS, top 5) is printed apart, and so is the
  one-time load of the thread after a start.  The synthetic vocabulary is tiny
  (20 words), so every query word is "very common": recall's worst case;
- archiving a turn through the thread log and adding it to the context, p50;
- prompt tokens with compression against the full history of a long synthetic
  conversation, and the share of pinned and REQUIRED facts still in the context
  or recallable — targets: >= 90% fewer tokens, >= 95% of the facts kept.
Recall latency at 100k / 1M archived messages: bench/bench_recall.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from figures import percentile, timed
from opencortex.conversation.conversations import Conversations
from opencortex.conversation.settings import ConversationSettings
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage

THREAD = Thread("cli", "bench")
WORDS = ("kernel plist archive branch budget pressure summary recall owner thread emacs "
         "buffer stream token model skill verifier actuator approval session").split()


def sentence(rng: random.Random, length: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(length))


def fill(archive: Archive, turns: int, rng: random.Random) -> None:
    """TURNS user/assistant pairs on one linear branch, written in large batches."""
    batch: list[NewMessage] = []
    for turn in range(turns):
        batch.append(NewMessage(role="user", text=f"question {turn}: {sentence(rng)}",
                                thread=THREAD))
        batch.append(NewMessage(role="assistant", text=f"answer {turn}: {sentence(rng, 20)}",
                                thread=THREAD))
        if len(batch) >= 2000:
            archive.append(batch)
            batch = []
    if batch:
        archive.append(batch)


async def assembly(turns: int) -> None:
    """The kernel's context for a turn (working context + recall, same owner) and the chat
    skill's prompt built from it, on a thread of TURNS turns."""
    from opencortex.config import load_config
    from opencortex.events import chat_message
    from opencortex.runtime import build_kernel
    rng = random.Random(turns)
    with tempfile.TemporaryDirectory() as tmp:
        kernel = build_kernel(load_config(Path(tmp)), writer=lambda text: None)
        fill(kernel.archive, turns, rng)
        started = time.perf_counter()
        conversation = await kernel.conversations.open(THREAD)
        loaded = time.perf_counter() - started
        build, record, recalling = [], [], []
        recall = kernel.conversations.recall
        recall.recall = timed(recalling, recall.recall)  # type: ignore[method-assign]
        for turn in range(200):
            event = chat_message(f"new {turn}: {sentence(rng)}", THREAD.channel, THREAD.chat_id)
            started = time.perf_counter()
            prepared = await kernel.preparation.prepare(event, conversation, kernel.persona)
            ctx, prompt = prepared.ctx, prepared.request
            build.append(time.perf_counter() - started - recalling[-1])
            messages = [NewMessage(role="user", text=event.text, thread=THREAD),
                        NewMessage(role="assistant", text=f"reply {turn}: {sentence(rng, 20)}",
                                   thread=THREAD)]
            started = time.perf_counter()
            await kernel.conversations.record_turn(THREAD, messages, {})
            record.append(time.perf_counter() - started)
        await kernel.aclose()
    print(f"  {turns:>7,} turns: assembly p50 {percentile(build, .5) * 1e3:6.3f} ms "
          f"p99 {percentile(build, .99) * 1e3:6.3f} ms ({len(prompt.messages)} prompt "
          f"messages, {len(ctx.history)} context entries) | recall p50 "
          f"{percentile(recalling, .5) * 1e3:6.2f} ms p95 {percentile(recalling, .95) * 1e3:6.2f}"
          f" ms | record turn p50 {statistics.median(record) * 1e3:5.2f} ms | first load "
          f"after start {loaded:5.2f} s")


FACT = "Fact {n}: the access code for vault {n} is {code}."


async def compression() -> None:
    """A long conversation with facts among chit-chat and chatter; budget 8k, summarize."""
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Archive(Path(tmp))
        settings = ConversationSettings(strategy="summarize", recall_k=5)
        conversations = Conversations(archive, settings)
        conversation = await conversations.open(THREAD)
        facts: dict[str, str] = {}
        full_tokens = 0
        pinned: list[str] = []
        for turn in range(1, 1501):
            if turn % 25 == 0:
                code = str(rng.randrange(10_000, 99_999))
                text = FACT.format(n=turn, code=code)
                facts[text] = code
            elif turn % 3 == 0:
                text = rng.choice(["ok", "thanks!", "lol", "great", "hi"])
            else:
                text = f"Let us talk about the {sentence(rng, 30)}"
            messages = [NewMessage(role="user", text=text, thread=THREAD),
                        NewMessage(role="assistant", text=f"Noted: {sentence(rng, 25)}",
                                   thread=THREAD)]
            records, _ = await conversations.record_turn(THREAD, messages, {})
            full_tokens += sum(len(m.text) // 4 + 1 for m in messages)
            if turn % 250 == 0:  # the person pins some facts (every 250th turn is one)
                conversation.log.pin(records[0].id)
                conversation.context.pin(records[0].id)
                pinned.append(text)
        in_context = "\n".join(entry.text for entry in conversation.context.entries)
        kept = 0
        for text, code in facts.items():
            if code in in_context:
                kept += 1
                continue
            number = text.split()[1].rstrip(":")
            found = conversations.recall.recall(THREAD, f"access code vault {number}", k=5)
            kept += any(code in entry.text for entry in found)
        used = conversation.context.used
        archive.close()
    print(f"  full history {full_tokens:,} tokens, working context {used:,} tokens "
          f"({100 * (1 - used / full_tokens):.1f}% fewer; target >= 90%)")
    print(f"  facts kept in context or recallable: {kept}/{len(facts)} "
          f"({100 * kept / len(facts):.1f}%; target >= 95%), pinned {len(pinned)}")


async def main(quick: bool) -> None:
    print("context assembly per turn (working context of the branch):")
    for turns in ([100, 10_000] if quick else [100, 10_000, 100_000]):
        await assembly(turns)
    print("compression on a 1,500-turn conversation (strategy summarize, budget 8,000):")
    await compression()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    asyncio.run(main(parser.parse_args().quick))
