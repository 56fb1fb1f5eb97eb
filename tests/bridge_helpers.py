"""What the bridge tests share: waiting bounded, scripted replies, a running bridge, an odd
item its platform cannot read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from opencortex.bridges.contract import Platform
from opencortex.bridges.inbox import Inbox
from opencortex.bridges.service import Bridge
from opencortex.bridges.settings import BridgeSettings, BridgesSettings
from opencortex.config import load_config
from opencortex.events import Thread
from opencortex.kernel import Kernel
from opencortex.llm import EchoBackend, ScriptBackend
from opencortex.runtime import build_kernel


async def until(predicate, seconds: float = 30.0) -> None:
    """Wait (bounded) until PREDICATE() is true."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting for the bridge")
        await asyncio.sleep(0.02)


async def archived_step(kernel: Kernel, thread: Thread, seconds: float = 30.0) -> str:
    """The text of the first tool step of THREAD's turn, once archived (bounded wait):
    an approval's outcome ("Done: ...") is told before its turn's write is durable
    (a reply is not: `Actuation.reply`), so a test that saw it may look before the
    record is there."""
    found: list = []

    def step() -> bool:
        found[:] = [r for r in kernel.archive.read_thread(thread)
                    if r.role == "system" and r.extra.get("STEP") == "1"]
        return bool(found)
    await until(step, seconds)
    [result] = found
    return result.text


def script(tmp_path: Path, *replies: str) -> ScriptBackend:
    """A backend answering REPLIES in order."""
    path = tmp_path / "replies.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    return ScriptBackend(path)


def run(coro) -> Any:
    """Run one scenario, bounded."""
    return asyncio.run(asyncio.wait_for(coro, 120))


@asynccontextmanager
async def running_bridge(home: Path, platform: Platform, settings: BridgeSettings, *,
                         backend=None, owners: dict[str, str] | None = None
                         ) -> AsyncIterator[tuple[Bridge, Kernel]]:
    """A kernel on HOME with PLATFORM's bridge (configured by SETTINGS) running."""
    config = load_config(home).model_copy(update={
        "bridges": BridgesSettings(**{platform.channel: settings})})
    if owners:
        config = config.model_copy(update={"llm": config.llm.model_copy(
            update={"owners": owners})})
    kernel = build_kernel(config, backend=backend or EchoBackend())
    running = Bridge(platform, settings, kernel,
                     Inbox(home / "bridges" / f"{platform.channel}.inbox.jsonl"), 30.0)
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    try:
        await until(lambda: running.bot_name or task.done(), 30)
        assert not task.done(), task.exception()
        yield running, kernel
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await kernel.aclose()


async def odd_item_skipped(running: Bridge, say: Callable[[str], Any],
                           replies: Callable[[], list[str]]) -> None:
    """RUNNING's platform fails to read (a TypeError quoting it) an item holding "odd
    one", as a defect meets odd input; SAY sends "odd one" and then "after it" as an
    allowed person: only the second is answered (REPLIES: the bot's texts to them),
    and the bridge counts no failure."""
    read = running.platform._item

    def reading(item: Any) -> Any:
        if "odd one" in str(item):
            raise TypeError("it quoted the odd one")
        return read(item)
    running.platform._item = reading
    say("odd one")
    say("after it")
    await until(replies, 30)
    assert replies() == ["[Echo] after it"]
    assert running.status["errors"] == 0
