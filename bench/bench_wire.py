"""ChatEvent wire benchmark (a script, not a test): the real server, real websockets clients.

    python bench/bench_wire.py            # 500 turns, 8 clients, 10 streams, 2000-event replay
    python bench/bench_wire.py --quick    # a few seconds

The kernel and the wire run in this process with the echo backend (a long fast
stream when the message starts with "stream"), so the moment the backend
yields its first chunk can be stamped.  Prints:
- message sent → ``done`` received, one client (p50 / p99), and what of it is the
  wire's (the round trip less the time inside `Kernel.handle`);
- the same with several clients at once, and the turns per second they get;
- first ``chunk`` received after the backend yielded the first text (p50 / p99);
- backend chunks vs ``chunk`` events during a fast stream (the coalescing);
- a reconnect that replays N missed events: connect → ``session`` event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from figures import percentile
from opencortex.config import load_config
from opencortex.llm import EchoBackend, PromptRequest, Usage
from opencortex.runtime import build_kernel
from opencortex.wire import WireLimits, start_wire
from opencortex.wire_protocol import VERSION

TOKEN = "bench-token-0123456789abcdef"


class TimedBackend(EchoBackend):
    """Echo, or for "stream …" a long reply in 4-character chunks, stamping the first one."""

    def __init__(self, words: int) -> None:
        super().__init__(warning=None)
        self.words = words
        self.first_yield: list[float] = []
        self.chunks_yielded = 0

    async def stream(self, request: PromptRequest):
        said = request.messages[-1].content.rsplit("\n\n", 1)[-1]
        if not said.startswith("stream"):
            async for item in super().stream(request):
                yield item
            return
        words = " ".join(f"w{i}" for i in range(self.words))
        form = f'(:type :REQUEST :target :cli :text "{words}")'
        for index in range(0, len(form), 4):
            if index == 0:
                self.first_yield.append(time.perf_counter())
            self.chunks_yielded += 1
            yield form[index:index + 4]
            if index % 64 == 0:
                await asyncio.sleep(0.001)       # a fast model: ~4 characters every ~0.1 ms
        yield Usage(model="timed-echo", estimated=True)


async def open_client(url: str, **auth: Any) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await connect(url, proxy=None, max_size=None, compression=None)
    await ws.send(json.dumps({"action": "auth", "version": VERSION,
                              "data": {"token": TOKEN, **auth}}))
    while True:
        event = json.loads(await ws.recv())
        if event["event"] == "session":
            return ws, event["data"]


async def turn(ws: ClientConnection, content: str, correlation: str,
               first_chunk: list[float] | None = None) -> int:
    """Send one message and read up to its ``done``; the chunk events seen."""
    await ws.send(json.dumps({"action": "message", "version": VERSION, "data": {
        "content": content, "correlation_id": correlation, "thread": correlation[:8]}}))
    chunks = 0
    while True:
        event = json.loads(await ws.recv())
        if event["event"] == "chunk":
            if chunks == 0 and first_chunk is not None:
                first_chunk.append(time.perf_counter())
            chunks += 1
        elif event["event"] == "done" and event["data"]["correlation_id"] == correlation:
            return chunks


async def round_trips(url: str, count: int, clients: int) -> tuple[list[float], float]:
    """COUNT turns per client, CLIENTS at once: each turn's seconds, and the wall time."""
    times: list[float] = []

    async def one(index: int) -> None:
        ws, _ = await open_client(url)
        for i in range(count):
            started = time.perf_counter()
            await turn(ws, f"message {i}", f"client{index:02d}-{i}")
            times.append(time.perf_counter() - started)
        await ws.close()

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    return times, time.perf_counter() - started


async def streams(url: str, backend: TimedBackend, count: int) -> tuple[list[float], list]:
    ws, _ = await open_client(url)
    firsts: list[float] = []
    ratios = []
    for i in range(count):
        before = backend.chunks_yielded
        started = time.perf_counter()
        events = await turn(ws, f"stream {i}", f"stream{i:03d}", firsts)
        ratios.append((backend.chunks_yielded - before, events, time.perf_counter() - started))
    await ws.close()
    delays = [(seen - yielded) * 1000 for seen, yielded in zip(firsts, backend.first_yield)]
    return delays, ratios


async def replay(url: str, missed: int) -> tuple[float, int]:
    """Run turns until the session holds about MISSED events, disconnect, resume from
    sequence 0: the seconds from connecting to the ``session`` event, and the events
    replayed."""
    ws, session = await open_client(url)
    for i in range(missed // 4):                  # chunk, message, done, status
        await turn(ws, f"message {i}", f"replay-{i}")
    await ws.close()
    started = time.perf_counter()
    ws, resumed = await open_client(url, session_id=session["session_id"], last_sequence=0)
    elapsed = time.perf_counter() - started
    await ws.close()
    return elapsed, resumed["replayed"]


async def run(turns: int, clients: int, stream_count: int, words: int, missed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        backend = TimedBackend(words)
        kernel = build_kernel(load_config(Path(tmp)), backend=backend, writer=lambda _: None)
        limits = WireLimits(replay_events=max(4096, missed * 2))
        server = await start_wire(kernel, port=0, token=TOKEN, limits=limits)
        url = f"ws://127.0.0.1:{server.port}"
        handled = time_handle(kernel)
        try:
            await round_trips(url, 10, 1)            # warm up
            handled.clear()
            single, _ = await round_trips(url, turns, 1)
            overhead = [trip - inside for trip, inside in zip(single, handled, strict=True)]
            many, wall = await round_trips(url, max(1, turns // clients), clients)
            delays, ratios = await streams(url, backend, stream_count)
            replay_s, replayed = await replay(url, missed)
        finally:
            await server.close()
            await kernel.aclose()
    report(single, overhead, many, wall, clients, delays, ratios, replay_s, replayed)


def time_handle(kernel: Any) -> list[float]:
    """Record the seconds of every `kernel.handle` call from now on."""
    record: list[float] = []
    original = kernel.handle

    async def handle(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - started)

    kernel.handle = handle
    return record


def report(single: list[float], overhead: list[float], many: list[float], wall: float,
           clients: int, delays: list[float], ratios: list, replay_s: float,
           replayed: int) -> None:
    def ms(values: list[float]) -> str:
        return (f"p50 {percentile(values, .5) * 1e3:.2f} ms  "
                f"p99 {percentile(values, .99) * 1e3:.2f} ms")

    print(f"message → done, 1 client, echo backend ({len(single)} turns): {ms(single)}")
    print(f"  of which the wire (round trip − kernel.handle): {ms(overhead)}")
    print(f"message → done, {clients} clients at once ({len(many)} turns): {ms(many)}; "
          f"{len(many) / wall:.0f} turns/s")
    print(f"first chunk received after the backend yielded it ({len(delays)} streams): "
          f"p50 {percentile(delays, .5):.2f} ms  p99 {percentile(delays, .99):.2f} ms")
    yielded = statistics.median(r[0] for r in ratios)
    events = statistics.median(r[1] for r in ratios)
    rate = statistics.median(r[1] / r[2] for r in ratios)
    print(f"fast stream: {yielded:.0f} backend chunks → {events:.0f} chunk events "
          f"(median; {rate:.0f} events/s)")
    print(f"resume replaying {replayed} events: connect → session event {replay_s * 1e3:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--missed", type=int, default=2000)
    parser.add_argument("--quick", action="store_true",
                        help="50 turns, 4 clients, 3 streams of 500 words, 200 missed events")
    args = parser.parse_args()
    words = 3000
    if args.quick:
        args.turns, args.clients, args.streams, args.missed, words = 50, 4, 3, 200, 500
    asyncio.run(run(args.turns, args.clients, args.streams, words, args.missed))


if __name__ == "__main__":
    main()
