"""Judging runs off the event loop, bounded in time (issue 8 §2)."""

from __future__ import annotations

import asyncio
import json
import threading

from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.llm import EchoBackend, ScriptBackend
from opencortex.runtime import build_kernel
from opencortex.verification import judge

# ~850 KB of bare symbols: the costliest shape to read and judge under the 1 MiB cap.
HOSTILE = ('(:type :REQUEST :target :cli :text "x" :junk ('
           + " ".join(f"s{i}" for i in range(120_000)) + "))")


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


async def _other_turns_while_judging(kernel, entered: threading.Event,
                                     release: threading.Event, count: int = 5) -> list[str]:
    """Statuses of COUNT echo turns of other threads, all run to the end while the
    "slow" thread's reply is held in judging (a judge on the loop would deadlock here)."""
    slow = asyncio.create_task(kernel.handle(chat_message("hi", "cli", "slow")))
    while not entered.is_set():  # bounded by run()'s timeout
        await asyncio.sleep(0.005)
    statuses = []
    for i in range(count):
        result = await kernel.handle(chat_message("hello", "cli", f"during-{i}"))
        assert not slow.done(), "the held reply finished before the other turns"
        statuses.append(result.status)
    release.set()
    assert (await slow).status == "done"
    return statuses


def test_other_threads_turns_run_to_the_end_while_a_reply_is_judged(config, monkeypatch):
    # No clock in this test: the "slow" thread's reply is held inside judging until the
    # other turns have finished; if judging ran on the event loop, none could.
    entered, release = threading.Event(), threading.Event()

    def held_judge(reply, skills, ctx, *args, **kwargs):
        if ctx.event.thread.chat_id == "slow":
            entered.set()
            release.wait(60)
        return judge(reply, skills, ctx, *args, **kwargs)

    monkeypatch.setattr("opencortex.replies.judge", held_judge)
    kernel = build_kernel(config, backend=EchoBackend(), writer=lambda text: None)
    try:
        statuses = run(_other_turns_while_judging(kernel, entered, release))
    finally:
        release.set()
        run(kernel.aclose())
    assert statuses == ["done"] * 5


def test_a_hostile_reply_is_refused_while_other_threads_go_on(config):
    # Without the element cap, judging this reply costs 100s of ms; it ends rejected.
    config = config.model_copy(update={"max_reply_elements": 1_000_000})
    kernel = build_kernel(config, backend=SplitBackend(), writer=lambda text: None)

    async def turns():
        hostile = asyncio.create_task(kernel.handle(chat_message("hi", "cli", "hostile")))
        other = await kernel.handle(chat_message("hello", "cli", "other"))
        return (await hostile).status, other.status

    try:
        assert run(turns()) == ("rejected", "done")
    finally:
        run(kernel.aclose())


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
