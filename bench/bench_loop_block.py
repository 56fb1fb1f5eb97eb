"""How long the kernel's event loop is blocked per turn, under concurrent turns (issue 14).

    python bench/bench_loop_block.py              # 20 concurrent threads, 50 turns each
    python bench/bench_loop_block.py --threads 50 --turns 20
    python bench/bench_loop_block.py --rate 200   # open loop: 200 turns/s over the threads
    python bench/bench_loop_block.py --quick      # a few seconds

CLIENTS concurrent "people", each in a thread of its own, send echo turns one
after another (closed loop), or, with --rate, turns are sent at that rate
round robin over the threads whatever the replies (open loop; a thread's turns
still run one after another).  The echo backend answers at once, so what is
measured is the kernel: routing, context, recall, the archive write.  Meanwhile a probe task
sleeps 1 ms in a loop and records how late it wakes: the loop lag, which every
other conversation pays whenever the loop is busy or blocked.  Printed:

- echo turn p50/p99 (ms) under that load, and turns per second;
- loop lag p50/p99/max (ms);
- loop busy per turn: wall time the loop did not spend waiting in its
  selector, divided by the turns (CPU on the loop thread per turn beside it;
  the difference is time the loop thread was blocked: disk, locks, the GIL).

To compare with another tree, run this script with PYTHONPATH pointing at that
tree's kernel/ (e.g. `git archive HEAD` exported to /tmp/head-before).
"""

from __future__ import annotations

import argparse
import asyncio
import selectors
import tempfile
import time
from pathlib import Path

from figures import percentile

PROBE_SLEEP = 0.001    # seconds the lag probe sleeps between two looks


class TimedSelector(selectors.DefaultSelector):
    """The default selector, adding up the time the loop spends waiting in it."""

    waited = 0.0

    def select(self, timeout=None):
        started = time.perf_counter()
        try:
            return super().select(timeout)
        finally:
            self.waited += time.perf_counter() - started


async def probe(lags: list[float], stop: asyncio.Event) -> None:
    """Record how late each PROBE_SLEEP sleep wakes, until STOP."""
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(PROBE_SLEEP)
        lags.append(max(0.0, time.perf_counter() - started - PROBE_SLEEP))


async def client(kernel, number: int, turns: int, latencies: list[float]) -> None:
    """One person sending TURNS echo turns in a thread of its own."""
    from opencortex.events import chat_message

    for turn in range(turns):
        started = time.perf_counter()
        result = await kernel.handle(chat_message(
            f"message {turn} from person {number} about topic {turn % 7}", "cli",
            f"load{number}"))
        if result.status != "done":
            raise SystemExit(f"a turn failed: {result.errors}")
        latencies.append(time.perf_counter() - started)


async def offered(kernel, clients: int, total: int, rate: float,
                  latencies: list[float]) -> None:
    """TOTAL turns sent at RATE per second round robin over CLIENTS threads; each
    latency counts from the moment its turn was due."""
    from opencortex.events import chat_message

    async def one(number: int, due: float) -> None:
        result = await kernel.handle(chat_message(
            f"message {number} from person {number % clients} about topic {number % 7}",
            "cli", f"load{number % clients}"))
        if result.status != "done":
            raise SystemExit(f"a turn failed: {result.errors}")
        latencies.append(time.perf_counter() - due)

    start, sent = time.perf_counter() + 0.01, []
    for number in range(total):
        due = start + number / rate
        if due > time.perf_counter():
            await asyncio.sleep(due - time.perf_counter())
        sent.append(asyncio.create_task(one(number, due)))
    await asyncio.gather(*sent)


async def measure(kernel, selector: TimedSelector, clients: int, turns: int,
                  rate: float | None = None) -> dict:
    """Run CLIENTS x TURNS turns with the probe (at RATE per second when given); the
    figures."""
    await asyncio.gather(*(client(kernel, n, 2, []) for n in range(clients)))   # warm up
    latencies: list[float] = []
    lags: list[float] = []
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(lags, stop))
    await asyncio.sleep(0.01)
    waited, cpu, started = selector.waited, time.thread_time(), time.perf_counter()
    if rate:
        await offered(kernel, clients, clients * turns, rate, latencies)
    else:
        await asyncio.gather(*(client(kernel, n, turns, latencies) for n in range(clients)))
    wall = time.perf_counter() - started
    busy = wall - (selector.waited - waited)
    cpu = time.thread_time() - cpu
    stop.set()
    await prober
    await kernel.aclose()
    count = clients * turns
    return {"turns": count, "wall": wall, "latencies": latencies, "lags": lags,
            "busy": busy / count, "cpu": cpu / count}


def run(clients: int, turns: int, rate: float | None = None) -> dict:
    from opencortex.config import load_config
    from opencortex.llm import EchoBackend
    from opencortex.runtime import build_kernel

    with tempfile.TemporaryDirectory() as tmp:
        selector = TimedSelector()
        with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
            kernel = build_kernel(load_config(Path(tmp)), backend=EchoBackend(),
                                  writer=lambda text: None)
            return runner.run(measure(kernel, selector, clients, turns, rate))


def report(figures: dict, clients: int, rate: float | None = None) -> None:
    ms = 1e3
    lat, lags = figures["latencies"], figures["lags"]
    how = f"offered at {rate:g}/s" if rate else "closed loop"
    print(f"{clients} concurrent threads, {figures['turns']} echo turns, {how} "
          f"({figures['turns'] / figures['wall']:.0f} turns/s):")
    print(f"  echo turn        p50 {percentile(lat, .5) * ms:7.2f} ms   "
          f"p99 {percentile(lat, .99) * ms:7.2f} ms")
    print(f"  loop lag         p50 {percentile(lags, .5) * ms:7.2f} ms   "
          f"p99 {percentile(lags, .99) * ms:7.2f} ms   max {max(lags) * ms:7.2f} ms "
          f"({len(lags)} probes)")
    print(f"  loop busy/turn       {figures['busy'] * ms:7.3f} ms   "
          f"(loop thread CPU/turn {figures['cpu'] * ms:.3f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=20, help="concurrent threads")
    parser.add_argument("--turns", type=int, default=50, help="turns per thread")
    parser.add_argument("--rate", type=float, help="open loop: turns offered per second")
    parser.add_argument("--quick", action="store_true", help="a few seconds: 5 threads x 5")
    args = parser.parse_args()
    clients, turns = (5, 5) if args.quick else (args.threads, args.turns)
    report(run(clients, turns, args.rate), clients, args.rate)


if __name__ == "__main__":
    main()
