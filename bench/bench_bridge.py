"""Benchmark: the chat bridges under many chats (a script, not a test): prints figures.

    python bench/bench_bridge.py           # 100 chats x 10 messages, every platform
    python bench/bench_bridge.py --quick   # 10 chats x 3 messages (the suite runs this)
    python bench/bench_bridge.py --platform signal   # one platform: telegram, signal, matrix
    python bench/bench_bridge.py --quick --platform matrix   # Matrix is opt-in when quick

Each simulated person sends their next message when the previous reply arrived,
through the real python-telegram-bot against the loopback fake Bot API of the
test suite.  Figures: messages per second, send → reply p50/p99, lost,
misrouted and out-of-order replies (all must be 0) — for the kernel with the echo
backend, and for a bare python-telegram-bot echo bot (`Application` with one
`MessageHandler`) on the same fake.  The difference is what the kernel adds.
Telegram's pacing (one message a second per chat) is switched off here: it
measures the platform's limit, not the kernel.

Signal is measured the same way against the loopback fake of signal-cli's
JSON-RPC daemon (tests/signal_fake.py): the kernel's Signal bridge, and as the
baseline a bare JSON-RPC client that subscribes and echoes each message with
`send` on one connection.

Matrix is measured against a real Synapse on 127.0.0.1 in end-to-end encrypted
rooms (matrix_load.py); the baseline is a bare matrix-nio echo bot.  Synapse
starts in about a second but is installed into <checkout>/.venv-synapse on
first use (about 25 s), so `--quick` leaves Matrix out unless it is asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from figures import percentile  # noqa: E402
from signal_fake import FakeSignalCli, Person  # noqa: E402
from telegram_fake import FakeBotApi  # noqa: E402

from opencortex.bridges.inbox import Inbox  # noqa: E402
from opencortex.bridges.service import Bridge  # noqa: E402
from opencortex.bridges.settings import SignalSettings, TelegramSettings  # noqa: E402
from opencortex.bridges.signal import SignalPlatform  # noqa: E402
from opencortex.bridges.telegram import TelegramPlatform  # noqa: E402
from opencortex.config import load_config  # noqa: E402
from opencortex.llm import EchoBackend  # noqa: E402
from opencortex.runtime import build_kernel  # noqa: E402

TOKEN = "4242:bench"


class Conversations:
    """People who each send COUNT messages, one after the other's reply."""

    def __init__(self, fake, chats: int, count: int, prefix: str):
        self.fake, self.chats, self.count, self.prefix = fake, chats, count, prefix
        self.sent_at: dict[str, float] = {}
        self.latencies: list[float] = []
        self.replies: dict[int, list[str]] = {chat: [] for chat in range(1, chats + 1)}
        self.misrouted = 0
        self.done = asyncio.Event()
        fake.on_sent = self.on_sent

    def message(self, chat: int, index: int) -> str:
        return f"c{chat}m{index}"

    def start(self) -> None:
        for chat in range(1, self.chats + 1):
            self.send(chat, 0)

    def send(self, chat: int, index: int) -> None:
        text = self.message(chat, index)
        self.sent_at[text] = time.perf_counter()
        self.deliver(chat, text)

    def deliver(self, chat: int, text: str) -> None:
        """Person CHAT sends TEXT on the platform."""
        self.fake.send(chat, text)

    def chat_of(self, sent) -> int:
        """The person a reply SENT went to (0: nobody known)."""
        return int(sent.chat_id)

    def on_sent(self, sent) -> None:
        chat = self.chat_of(sent)
        text = sent.text.removeprefix(self.prefix)
        if text not in self.sent_at or not text.startswith(f"c{chat}m"):
            self.misrouted += 1
            return
        self.latencies.append(time.perf_counter() - self.sent_at[text])
        self.replies[chat].append(text)
        index = len(self.replies[chat])
        if index < self.count:
            self.send(chat, index)
        elif all(len(r) >= self.count for r in self.replies.values()):
            self.done.set()

    def figures(self, elapsed: float) -> dict[str, float]:
        got = sum(len(r) for r in self.replies.values())
        ordered = all(r == [self.message(c, i) for i in range(len(r))]
                      for c, r in self.replies.items())
        return {"msgs/s": got / elapsed, "p50 ms": 1000 * percentile(self.latencies, 0.5),
                "p99 ms": 1000 * percentile(self.latencies, 0.99),
                "lost": self.chats * self.count - got, "misrouted": self.misrouted,
                "out of order": 0 if ordered else 1}


async def through_kernel(platform, settings, home: Path, people: Conversations,
                         ready=lambda: True) -> dict[str, float]:
    """PEOPLE's conversations through a kernel (echo backend) running PLATFORM's bridge,
    unpaced (the platform's limits are not what is measured); their figures."""
    kernel = build_kernel(load_config(home), backend=EchoBackend())
    platform.per_chat, platform.per_second = 0.0, 1e6
    bridge = Bridge(platform, settings, kernel, Inbox(home / "inbox.jsonl"), 30)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    while not bridge.bot_name or not ready():
        await asyncio.sleep(0.01)
    started = time.perf_counter()
    people.start()
    await asyncio.wait_for(people.done.wait(), 600)
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    await kernel.aclose()
    return people.figures(elapsed)


async def kernel_run(chats: int, count: int) -> dict[str, float]:
    fake = FakeBotApi(TOKEN)
    url = await fake.start()
    settings = TelegramSettings(enabled=True, base_url=url, poll_timeout=1,
                                allow=[str(c) for c in range(1, chats + 1)],
                                messages_per_minute=600)
    try:
        return await through_kernel(TelegramPlatform(settings, TOKEN), settings,
                                    Path(tempfile.mkdtemp(prefix="bench-bridge-")),
                                    Conversations(fake, chats, count, "[Echo] "))
    finally:
        await fake.stop()


async def bare_run(chats: int, count: int) -> dict[str, float]:
    from telegram.ext import ApplicationBuilder, MessageHandler, filters
    fake = FakeBotApi(TOKEN)
    url = await fake.start()

    async def echo(update, context) -> None:
        await update.message.reply_text(update.message.text)
    app = ApplicationBuilder().token(TOKEN).base_url(url).build()
    app.add_handler(MessageHandler(filters.TEXT, echo))
    await app.initialize()
    await app.start()
    await app.updater.start_polling(poll_interval=0, timeout=1)
    people = Conversations(fake, chats, count, "")
    started = time.perf_counter()
    people.start()
    await asyncio.wait_for(people.done.wait(), 600)
    elapsed = time.perf_counter() - started
    await app.updater.stop()
    await app.stop()
    await app.shutdown()
    await fake.stop()
    return people.figures(elapsed)


# -- Signal ------------------------------------------------------------------------

class SignalConversations(Conversations):
    """The same people on Signal: person N writes from a UUID and is answered there."""

    def __init__(self, fake: FakeSignalCli, chats: int, count: int, prefix: str):
        self.people = {n: Person(f"00000000-0000-4000-8000-{n:012d}", f"+1666{n:07d}", f"p{n}")
                       for n in range(1, chats + 1)}
        self.numbers = {person.uuid: n for n, person in self.people.items()}
        super().__init__(fake, chats, count, prefix)

    def deliver(self, chat: int, text: str) -> None:
        self.fake.message(self.people[chat], text)

    def chat_of(self, sent) -> int:
        return self.numbers.get(sent.chat_id, 0)


async def signal_kernel_run(chats: int, count: int) -> dict[str, float]:
    fake = FakeSignalCli()
    address = await fake.start()
    people = SignalConversations(fake, chats, count, "[Echo] ")
    settings = SignalSettings(enabled=True, address=address, poll_timeout=1,
                              allow=list(people.numbers), messages_per_minute=600)
    try:                                       # the first fetch subscribes: wait for it
        return await through_kernel(SignalPlatform(settings), settings,
                                    Path(tempfile.mkdtemp(prefix="bench-bridge-signal-")),
                                    people, ready=lambda: "subscribeReceive" in fake.calls)
    finally:
        await fake.stop()


async def signal_bare_run(chats: int, count: int) -> dict[str, float]:
    """A bare signal-cli JSON-RPC client: subscribe, and `send` each message back."""
    fake = FakeSignalCli()
    host, _, port = (await fake.start()).rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=16 << 20)
    ids = itertools.count(1)

    def request(method: str, params: dict) -> None:
        writer.write(json.dumps({"jsonrpc": "2.0", "method": method, "params": params,
                                 "id": next(ids)}).encode() + b"\n")

    async def echo() -> None:
        while line := await reader.readline():
            note = json.loads(line)
            if note.get("method") == "receive":
                envelope = note["params"]["result"].get("envelope") or {}
                text = (envelope.get("dataMessage") or {}).get("message")
                if text:
                    request("send", {"recipient": [envelope["sourceUuid"]], "message": text})
    request("subscribeReceive", {})
    echoing = asyncio.create_task(echo())
    people = SignalConversations(fake, chats, count, "")
    started = time.perf_counter()
    people.start()
    await asyncio.wait_for(people.done.wait(), 600)
    elapsed = time.perf_counter() - started
    echoing.cancel()
    writer.close()
    await fake.stop()
    return people.figures(elapsed)


def show(name: str, figures: dict[str, float]) -> None:
    print(f"{name:<26} " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in figures.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 chats x 3 messages")
    parser.add_argument("--platform", choices=("telegram", "signal", "matrix", "all"),
                        default="all", help="all: every platform (without matrix if --quick)")
    args = parser.parse_args()
    chats, count = (10, 3) if args.quick else (100, 10)
    if args.platform in ("telegram", "all"):
        compare("Telegram", ("bare python-telegram-bot", bare_run), kernel_run, chats, count)
    if args.platform in ("signal", "all"):
        compare("Signal", ("bare signal-cli client", signal_bare_run), signal_kernel_run,
                chats, count)
    if args.platform == "matrix" or (args.platform == "all" and not args.quick):
        matrix_compare(chats, count)


def matrix_compare(chats: int, count: int) -> None:
    """The Matrix bridge against a real Synapse (see matrix_load.py)."""
    import logging
    from matrix_load import matrix_figures
    logging.getLogger("nio").setLevel(logging.ERROR)   # the person's and the bare bot's
    print(f"Matrix bridge, {chats} chats x {count} messages, echo backend, real Synapse, "
          f"encrypted rooms")
    bare, kernel = asyncio.run(matrix_figures(chats, count))
    show("bare matrix-nio", bare)
    show("opencortex kernel", kernel)
    print(f"kernel adds: p50 {kernel['p50 ms'] - bare['p50 ms']:.1f} ms, "
          f"p99 {kernel['p99 ms'] - bare['p99 ms']:.1f} ms per message")


def compare(platform: str, bare_named: tuple, kernel_run_of, chats: int, count: int) -> None:
    """Run the bare baseline and the kernel on PLATFORM; print both and the difference."""
    print(f"{platform} bridge, {chats} chats x {count} messages, echo backend, loopback fake")
    name, bare_run_of = bare_named
    bare = asyncio.run(bare_run_of(chats, count))
    show(name, bare)
    kernel = asyncio.run(kernel_run_of(chats, count))
    show("opencortex kernel", kernel)
    print(f"kernel adds: p50 {kernel['p50 ms'] - bare['p50 ms']:.1f} ms, "
          f"p99 {kernel['p99 ms'] - bare['p99 ms']:.1f} ms per message")


if __name__ == "__main__":
    main()
