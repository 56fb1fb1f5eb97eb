"""Pieces of the load benchmark (bench_load.py): a served kernel and asyncio EPC clients.

- `ServedKernel`: `python -m opencortex serve --backend echo` on a temporary home
  (the kernel of another source tree when given), its port line read with a
  deadline, stopped (terminate, then kill) by `stop`.
- `LoadClient`: one Emacs stand-in on one connection, written on asyncio so that
  twenty of them cost the benchmark little: it authenticates, calls
  `send-message`, answers every call the kernel makes into it (`opencortex-stream`,
  `opencortex-insert`, `opencortex-status-changed`, ...) with `t`, and stamps each
  message's acknowledgement, first streamed chunk and reply.
- `Turn`: one message's stamps.

A reply is an `opencortex-stream` "end" carrying text, or an `opencortex-insert`
(the same as the test suite's `finals`); it is matched to its message by a token
in the text, so a reply to the wrong message or a second reply is counted.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import sexpdata
from epc.handler import encode_message
from sexpdata import Symbol

from bench_startup import connection_secret, environment

TOKEN = re.compile(r"\bk(\d+)x(\d+)\b")
TOPICS = ("heron", "walrus", "okapi", "pelican", "lynx", "marmot", "ibis", "tapir", "gecko",
          "bison", "osprey", "narwhal", "quokka", "jackal", "puffin", "wombat", "caracal",
          "dingo", "egret", "ferret", "gibbon", "hyena", "iguana", "jaguar", "kestrel",
          "lemur", "magpie", "newt", "ocelot", "panda", "quail", "raven", "serval", "toucan",
          "urchin", "vole", "wren", "yak", "zebu", "badger")   # each in 1/40 of the messages
HOME_CONFIG = "[emacs]\nmax_connections = 64\ncall_timeout = 30\n"


def process_cpu_seconds(pid: int) -> float:
    """CPU time process PID has used, user and system, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServedKernel:
    """`opencortex serve --backend echo` in ROOT (home and runtime directory there)."""

    def __init__(self, root: Path, tree: Path | None, port_timeout: float = 60.0):
        home, self.runtime = root / "home", root / "run"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(HOME_CONFIG)
        self.stderr = open(root / "stderr", "w+b")     # a file: a full pipe would stall it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "opencortex", "serve", "--backend", "echo"],
            stdout=subprocess.PIPE, stderr=self.stderr,
            env=environment(home, self.runtime, "warm", tree))
        try:
            self.port = int(self._first_line(port_timeout))
        except BaseException:
            self.stop()
            raise

    def _first_line(self, timeout: float) -> str:
        """The port line, waited for at most TIMEOUT seconds."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise RuntimeError(f"no port line within {timeout:g} s: {self.errors()}")
        line = self.process.stdout.readline().decode()
        if not line.strip().isdigit():
            raise RuntimeError(f"no port line ({line!r}): {self.errors()}")
        return line

    def secret(self) -> str:
        return connection_secret(self.runtime)

    def cpu_seconds(self) -> float:
        """CPU time the kernel process has used, user and system, all threads."""
        return process_cpu_seconds(self.process.pid)

    def children_cpu_seconds(self) -> float:
        """CPU time the kernel's running child processes have used (serve's archive
        writer process): work moved there is still work."""
        total = 0.0
        for children in Path(f"/proc/{self.process.pid}/task").glob("*/children"):
            for pid in children.read_text().split():
                try:
                    total += process_cpu_seconds(int(pid))
                except (FileNotFoundError, ProcessLookupError):
                    pass            # it ended meanwhile
        return total

    def errors(self) -> str:
        """The end of the kernel's stderr (never message content: echo turns log none)."""
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
        self.process.stdout.close()
        self.stderr.close()


@dataclass
class Turn:
    """One message of one client, with perf_counter stamps (None: not seen)."""

    text: str
    sent: float
    acked: float | None = None
    first_chunk: float | None = None
    replied: float | None = None
    replies: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class LoadClient:
    """An Emacs stand-in on one EPC connection; see the module doc."""

    def __init__(self, number: int, counts: "Counts", topics: bool = False):
        """TOPICS: each message also names an animal (1/40 of the messages name each), so
        recall ranks that word's matches and brings some back every turn."""
        self.number = number
        self.topics = topics
        self.chat = f"{'topics' if topics else 'load'}-{number}"
        self.counts = counts
        self.uids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future] = {}
        self.turns: list[Turn] = []
        self.by_turn_id: dict[str, Turn] = {}
        self.early: dict[str, list[float]] = {}        # chunks seen before their ack
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task | None = None

    async def connect(self, port: int, secret: str, timeout: float = 60.0) -> None:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, limit=16 << 20), timeout)
        self.task = asyncio.create_task(self._read())
        if await asyncio.wait_for(self.call("authenticate", secret), timeout) is not True:
            raise RuntimeError("the kernel refused the secret")

    def call(self, method: str, *args) -> asyncio.Future:
        """Send a call; a future of its return value."""
        uid = next(self.uids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[uid] = future
        self.writer.write(encode_message("call", uid, Symbol(method), list(args)))
        return future

    def send(self) -> Turn:
        """Send this client's next message; its Turn (acknowledged and replied later)."""
        index = len(self.turns)
        about = f" about the {TOPICS[(7 * self.number + index) % len(TOPICS)]}" \
            if self.topics else ""
        turn = Turn(f"message k{self.number}x{index}{about}", time.perf_counter())
        self.turns.append(turn)
        ack = self.call("send-message", self.chat, turn.text)
        ack.add_done_callback(lambda done: self._acked(turn, done))
        return turn

    def _acked(self, turn: Turn, ack: asyncio.Future) -> None:
        turn.acked = time.perf_counter()
        if ack.exception() is not None:
            self.counts.errors += 1
            return
        value = ack.result()
        turn_id = value[value.index(Symbol(":turn-id")) + 1]
        self.by_turn_id[turn_id] = turn
        if turn_id in self.early:
            turn.first_chunk = min(self.early.pop(turn_id))

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(6)
                frame = await self.reader.readexactly(int(head, 16))
                self._dispatch(sexpdata.loads(frame.decode()), time.perf_counter())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError("the kernel closed the connection"))

    def _dispatch(self, message: list, now: float) -> None:
        kind, uid = str(message[0]), message[1]
        if kind == "call":
            self.writer.write(encode_message("return", uid, True))
            self._called(str(message[2]), message[3] if len(message) > 3 else [], now)
        elif kind in ("return", "return-error", "epc-error"):
            future = self.waiting.pop(uid, None)
            if future is None or future.done():
                self.counts.errors += 1
            elif kind == "return":
                future.set_result(message[2])
            else:
                future.set_exception(RuntimeError(f"{kind}: {message[2]}"))

    def _called(self, method: str, args: list, now: float) -> None:
        """The kernel called METHOD in this "Emacs" at NOW."""
        if method == "opencortex-stream" and len(args) == 3:
            turn_id, kind, text = args
            if kind == "chunk":
                turn = self.by_turn_id.get(turn_id)
                if turn is None:
                    self.early.setdefault(turn_id, []).append(now)
                elif turn.first_chunk is None:
                    turn.first_chunk = now
            elif kind == "end" and text:
                self._reply(text, now)
            elif kind == "abort":
                self.counts.errors += 1
        elif method == "opencortex-insert" and len(args) == 2:
            self._reply(args[1], now)
        elif method == "opencortex-show-error":
            self.counts.errors += 1

    def _reply(self, text: str, now: float) -> None:
        found = TOKEN.search(text)
        number, index = (int(found.group(1)), int(found.group(2))) if found else (-1, -1)
        if number != self.number or index >= len(self.turns):
            self.counts.misrouted += 1
            return
        turn = self.turns[index]
        turn.replies += 1
        if turn.replies > 1:
            self.counts.duplicated += 1
            return
        turn.replied = now
        turn.done.set()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await asyncio.wait_for(self.writer.wait_closed(), 5)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        if self.task is not None:
            self.task.cancel()


@dataclass
class Counts:
    """Problems seen across clients."""

    errors: int = 0          # refused calls, aborted turns, errors shown, unmatched returns
    misrouted: int = 0       # a reply with another client's (or no) message token
    duplicated: int = 0      # a second reply to one message


async def connect_all(port: int, secret: str, count: int, counts: Counts,
                      topics: bool = False) -> list[LoadClient]:
    """COUNT authenticated clients (see LoadClient for TOPICS); the first alone, so a
    kernel still being built (the port line now comes first) is waited for before the
    rest queue up."""
    clients = [LoadClient(n, counts, topics) for n in range(count)]
    await clients[0].connect(port, secret)
    await asyncio.gather(*(c.connect(port, secret) for c in clients[1:]))
    return clients
