"""The Matrix part of bench_bridge.py: people and bots on one real Synapse (a module, not a script).
127.0.0.1, end-to-end encrypted rooms, people (matrix-nio clients, ten rooms each) talking
in CHATS rooms at once, each sending their next message when the previous reply came.

Figures, as for Telegram: messages per second, send → reply p50/p99, lost, misrouted
and out-of-order replies (all must be 0) — for the kernel's Matrix bridge with the
echo backend, and for a bare matrix-nio echo bot (the same client, a sync loop and a
reply task per message) in the same setting.  The difference is what the kernel adds.
Pacing is off and the bots have no homeserver rate limit: it measures the kernel.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import percentile
from matrix_person import Person
from synapse import Account, Homeserver

from opencortex.bridges.inbox import Inbox
from opencortex.bridges.matrix import MatrixPlatform
from opencortex.bridges.service import Bridge
from opencortex.bridges.settings import MatrixSettings
from opencortex.config import load_config
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

DEADLINE = 600.0       # seconds a run may take before what is missing counts as lost
ROOMS_PER_PERSON = 10  # as on Telegram, people are senders: each stays under the flood limit


class MatrixConversations:
    """People in rooms (each room one chat), sending COUNT messages in each, one per reply."""

    def __init__(self, rooms: dict[str, Person], bot: str, count: int, prefix: str):
        self.rooms, self.order = rooms, list(rooms)
        self.bot, self.count, self.prefix = bot, count, prefix
        self.people = list(dict.fromkeys(rooms.values()))
        self.sent_at: dict[str, float] = {}
        self.latencies: list[float] = []
        self.replies: dict[str, list[str]] = {room: [] for room in rooms}
        self.misrouted = 0
        self._read = {id(person): len(person.events) for person in self.people}
        self._sending: set[asyncio.Task[Any]] = set()

    def message(self, room: str, index: int) -> str:
        return f"c{self.order.index(room)}m{index}"

    async def run(self) -> float:
        """Talk until every reply came (or DEADLINE); the seconds it took."""
        started = time.perf_counter()
        for room in self.rooms:
            self._send(room, 0)
        await asyncio.gather(*(self._listen(person, started + DEADLINE)
                               for person in self.people))
        await asyncio.gather(*self._sending)
        return time.perf_counter() - started

    async def _listen(self, person: Person, deadline: float) -> None:
        while not self.done() and time.perf_counter() < deadline:
            await person.sync(200)
            self._read_replies(person)

    def done(self) -> bool:
        return all(len(replies) >= self.count for replies in self.replies.values())

    def _send(self, room: str, index: int) -> None:
        text = self.message(room, index)
        self.sent_at[text] = time.perf_counter()
        task = asyncio.create_task(self.rooms[room].say(room, text))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _read_replies(self, person: Person) -> None:
        fresh = person.events[self._read[id(person)]:]
        self._read[id(person)] = len(person.events)
        for room, event in fresh:
            if event.sender != self.bot or not hasattr(event, "body"):
                continue
            text = event.body.removeprefix(self.prefix)
            if room not in self.replies or text not in self.sent_at or \
                    not text.startswith(f"c{self.order.index(room)}m"):
                self.misrouted += 1
                continue
            self.latencies.append(time.perf_counter() - self.sent_at[text])
            self.replies[room].append(text)
            if len(self.replies[room]) < self.count:
                self._send(room, len(self.replies[room]))

    def figures(self, elapsed: float) -> dict[str, float]:
        got = sum(len(r) for r in self.replies.values())
        ordered = all(r == [self.message(room, i) for i in range(len(r))]
                      for room, r in self.replies.items())
        return {"msgs/s": got / elapsed, "p50 ms": 1000 * percentile(self.latencies, 0.5),
                "p99 ms": 1000 * percentile(self.latencies, 0.99),
                "lost": len(self.rooms) * self.count - got, "misrouted": self.misrouted,
                "out of order": 0 if ordered else 1}


async def _rooms(people: list[Person], bot: str, chats: int) -> dict[str, Person]:
    """CHATS encrypted rooms, each made by one of PEOPLE in turn, the bot invited to each."""
    rooms = {}
    for index in range(chats):
        person = people[index % len(people)]
        rooms[await person.create_room([bot], encrypted=True)] = person
    for person in people:
        await person.until(lambda: all(person.membership(room, bot) == "join"
                                       for room, owner in rooms.items() if owner is person),
                           120)
    return rooms


async def kernel_run(server: Homeserver, work: Path, bot: Account, people: list[Person],
                     chats: int, count: int) -> dict[str, float]:
    """The kernel's Matrix bridge answering with the echo backend."""
    home = work / "home"
    home.mkdir()
    kernel = build_kernel(load_config(home), backend=EchoBackend())
    settings = MatrixSettings(enabled=True, homeserver=server.url, user_id=bot.user_id,
                              allow=[person.user_id for person in people],
                              messages_per_minute=600, poll_timeout=5)
    platform = MatrixPlatform(settings, bot.password, home / "bridges" / "matrix",
                              password=True)
    platform.per_chat, platform.per_second = 0.0, 1e6
    bridge = Bridge(platform, settings, kernel, Inbox(home / "bridges" / "matrix.inbox"), 30)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    try:
        talk = MatrixConversations(await _rooms(people, bot.user_id, chats), bot.user_id,
                                   count, "[Echo] ")
        return talk.figures(await talk.run())
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await kernel.aclose()


async def bare_run(server: Homeserver, work: Path, bot: Account, people: list[Person],
                   chats: int, count: int) -> dict[str, float]:
    """A bare matrix-nio echo bot: sync, decrypt, reply (one task per reply); joins invites."""
    from nio import AsyncClient, AsyncClientConfig, InviteMemberEvent, RoomMessageText
    store = work / "bare"
    store.mkdir()
    client = AsyncClient(server.url, bot.user_id, store_path=str(store),
                         config=AsyncClientConfig(store_sync_tokens=False))
    await client.login(bot.password)

    replying: set[asyncio.Task[Any]] = set()

    async def echo(room: Any, event: Any) -> None:   # replies in parallel, as the kernel does
        if event.sender != client.user_id:
            task = asyncio.create_task(client.room_send(
                room.room_id, "m.room.message", {"msgtype": "m.text", "body": event.body},
                ignore_unverified_devices=True))
            replying.add(task)
            task.add_done_callback(replying.discard)

    async def invited(room: Any, event: Any) -> None:
        if event.state_key == client.user_id and event.membership == "invite":
            await client.join(room.room_id)
    await client.sync(0)
    client.add_event_callback(echo, RoomMessageText)
    client.add_event_callback(invited, InviteMemberEvent)
    syncing = asyncio.create_task(client.sync_forever(timeout=5000))
    try:
        talk = MatrixConversations(await _rooms(people, bot.user_id, chats), bot.user_id,
                                   count, "")
        return talk.figures(await talk.run())
    finally:
        syncing.cancel()
        await asyncio.gather(syncing, return_exceptions=True)
        await client.close()


async def matrix_figures(chats: int, count: int) -> tuple[dict[str, float], dict[str, float]]:
    """(bare matrix-nio, kernel) figures against one Synapse started for them."""
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as scratch, \
            Homeserver(Path(scratch) / "synapse") as server:
        work = Path(scratch)
        admin = server.register("admin", admin=True)
        people: list[Person] = []
        try:
            for number in range(-(-chats // ROOMS_PER_PERSON)):
                account = server.register(f"person{number}")
                people.append(await Person(server, account, work / f"person{number}").start())
            results = []
            for name, run in (("bare", bare_run), ("kernel", kernel_run)):
                bot = server.register(f"{name}bot")
                server.override_ratelimit(admin, bot.user_id, per_second=0, burst=0)
                (work / name).mkdir()
                results.append(await run(server, work / name, bot, people, chats, count))
            return results[0], results[1]
        finally:
            for person in people:
                await person.close()
