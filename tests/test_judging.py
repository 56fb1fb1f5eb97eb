"""Judging runs off the event loop, bounded in time (issue 8 §2)."""

from __future__ import annotations

import asyncio
import json
import time

from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.llm import EchoBackend, ScriptBackend
from opencortex.runtime import build_kernel
from opencortex.turn import TurnObserver

# ~850 KB of bare symbols: the costliest shape to read and judge under the 1 MiB cap.
HOSTILE = ('(:type :REQUEST :target :cli :text "x" :junk ('
           + " ".join(f"s{i}" for i in range(120_000)) + "))")


class ReplyDone(TurnObserver):
    def __init__(self) -> None:
        self.done = asyncio.Event()

    def on_reply_done(self) -> None:
        self.done.set()


class SplitBackend(EchoBackend):
    """Thread "hostile" gets HOSTILE; every other thread an echo."""

    async def stream(self, request):
        if request.reply_to and request.reply_to.chat_id == "hostile":
            yield HOSTILE
            return
        async for item in super().stream(request):
            yield item


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


async def _other_turns_while_judging(kernel, count: int = 5) -> tuple[float, float]:
    """(best echo turn alone, best echo turn while a hostile reply is judged), in s."""
    alone = []
    for i in range(count):
        started = time.perf_counter()
        await kernel.handle(chat_message("hello", "cli", f"alone-{i}"))
        alone.append(time.perf_counter() - started)
    observer = ReplyDone()
    hostile = asyncio.create_task(kernel.handle(chat_message("hi", "cli", "hostile"), observer))
    await observer.done.wait()
    during = []
    for i in range(count):
        started = time.perf_counter()
        await kernel.handle(chat_message("hello", "cli", f"during-{i}"))
        if not hostile.done():
            during.append(time.perf_counter() - started)
    judged_while_others_ran = not hostile.done() or bool(during)
    result = await hostile
    assert result.status == "rejected"
    assert judged_while_others_ran, "the hostile reply was judged before another turn ran"
    return min(alone), min(during)


def test_a_hostile_reply_delays_another_thread_by_less_than_100ms(config):
    # Without the element cap, judging this reply costs 100s of ms (it is refused at the
    # cap in a few ms otherwise): long enough for other turns to run while it is judged.
    config = config.model_copy(update={"max_reply_elements": 1_000_000})
    kernel = build_kernel(config, backend=SplitBackend(), writer=lambda text: None)
    try:
        alone, during = run(_other_turns_while_judging(kernel))
    finally:
        run(kernel.aclose())
    assert during - alone < 0.100, (alone, during)


def test_judging_past_the_time_limit_rejects_the_reply(home, tmp_path):
    config = load_config(home).model_copy(update={"judge_timeout": 0.001, "max_rejections": 0})
    path = tmp_path / "replies.jsonl"
    path.write_text(json.dumps({"text": HOSTILE, "chunks": [HOSTILE]}) + "\n")
    printed: list[str] = []
    kernel = build_kernel(config, backend=ScriptBackend(path), writer=printed.append)
    try:
        result = run(kernel.handle(chat_message("hi")))
    finally:
        run(kernel.aclose())
    assert result.status == "rejected"
    assert "took longer than" in result.errors[0]
    assert printed and "took longer than" in printed[0]
