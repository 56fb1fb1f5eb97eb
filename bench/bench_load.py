"""The kernel under concurrent load (issue 14; a script, not a test): prints figures.

    python bench/bench_load.py             # the full run, this checkout
    python bench/bench_load.py --quick     # a few seconds (the suite runs this)
    python bench/bench_load.py --tree /tmp/before --tree .   # two kernels, interleaved

Figures, each beside its target:
1. 20 EPC clients x 50 messages over real EPC against a real `opencortex serve`
   (echo backend, temporary home); each client sends its next message when the
   reply to the previous one came: messages/s sustained, acknowledgement
   (`send-message`'s return) p50/p99, send -> reply p50/p99, lost / duplicated /
   misrouted replies and errors (must be 0); and the kernel process's CPU time
   (user + system, all threads) per turn, steadier than msgs/s on a busy machine,
   with its archive writer process's apart (when `[memory] write_process` is on).
2. send -> reply p50/p99 at a fixed offered rate (200 turns/s over the 20
   clients, open loop: sends are scheduled whatever the replies), and lost.
3. send -> first streamed chunk at the EPC client, one client: p50/p99.  The
   target is "visible in Emacs"; the EPC client is the closest proxy (Emacs adds
   its own redisplay, see bench_emacs.py).
4. part 1 again in new chats, each message also naming one of 40 animals (each
   in 1/40 of the messages): "recalling", where recall ranks that word's
   matches and brings some back into every prompt.
5. 100 chats x 10 messages through the Telegram bridge and the loopback fake Bot
   API (bench_bridge.py's run, with duplicates counted).
6. a whole echo turn in-process, `kernel.handle` (bench_core.py's bench_kernel).
7. exec of `opencortex serve` -> port line, warm skill cache (bench_startup.py).
8. before the first part and after the last, the machine's own stalls with no load
   of ours (figures.cpu_steadiness): the p99 figures hold them, whatever the kernel.

Parts 1-4 run in that order on one kernel per tree and round, so the later parts
find the archive the earlier ones left (~2,000 messages after part 1).  Part 1's
messages read "message kNxM": "message" is in every message and the token is
new, so recall finds no word worth ranking and brings nothing back (before
c65b9c4 it brought the newest matches of "message" into every prompt); part 4
is the same load with recall at work.

With `--tree`, the served kernel (and, in a child process, the in-process parts)
run from that source tree's `kernel/`; given twice, the two are measured part by
part, alternately, and a table with the ratio second/first is printed.  Every
wait is bounded and every process started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import SLOW_FACTOR, cpu_steadiness, percentile
from load_clients import Counts, LoadClient, ServedKernel, Turn, connect_all

HERE = Path(__file__).resolve().parent
REPLY_TIMEOUT = 30.0         # seconds one reply may take before it counts as lost
PART_TIMEOUT = 600.0         # seconds any one part may take
TARGETS = {"EPC sustained msgs/s": (">=", 500), "open loop send->reply p99 ms": ("<=", 50),
           "first chunk p99 ms": ("<=", 20), "echo turn p50 ms": ("<=", 2),
           "port line p50 s": ("<=", 0.3)}
COUNTS = ("lost", "duplicated", "misrouted", "errors")   # summed over rounds; must be 0


def ms(values: list[float], share: float) -> float:
    """The SHARE percentile of VALUES (seconds) in milliseconds (nan when empty)."""
    return 1000 * percentile(values, share) if values else float("nan")


def latencies(turns: list[Turn]) -> dict[str, list[float]]:
    """Seconds from each send to its acknowledgement, reply and first chunk (when seen)."""
    return {"ack": [t.acked - t.sent for t in turns if t.acked is not None],
            "reply": [t.replied - t.sent for t in turns if t.replied is not None],
            "chunk": [t.first_chunk - t.sent for t in turns if t.first_chunk is not None]}


def problems(prefix: str, clients: list[LoadClient], counts: Counts) -> dict[str, float]:
    """Lost, duplicated and misrouted replies and errors, named with PREFIX."""
    turns = [t for c in clients for t in c.turns]
    return {f"{prefix} lost": sum(t.replied is None for t in turns),
            f"{prefix} duplicated": counts.duplicated, f"{prefix} misrouted": counts.misrouted,
            f"{prefix} errors": counts.errors}


async def closing(clients: list[LoadClient]) -> None:
    """Close every client's connection."""
    await asyncio.gather(*(c.close() for c in clients))


async def wait_replies(turns: list[Turn], timeout: float) -> None:
    """Until every turn is replied, or TIMEOUT seconds (then the rest count as lost)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(t.done.wait() for t in turns)), timeout)


async def warm_up(port: int, secret: str) -> None:
    """A few turns first: the kernel's first turn loads what later ones reuse."""
    counts = Counts()
    [client] = await connect_all(port, secret, 1, counts)
    for _ in range(3):
        await wait_replies([client.send()], REPLY_TIMEOUT)
    await closing([client])


async def closed_loop(port: int, secret: str, clients_n: int, messages: int,
                      topics: bool = False) -> dict:
    """Part 1 (and with TOPICS, part 4): each client sends its next message when its
    last reply came."""
    counts = Counts()
    clients = await connect_all(port, secret, clients_n, counts, topics)

    async def person(client: LoadClient) -> None:
        for _ in range(messages):
            await wait_replies([client.send()], REPLY_TIMEOUT)
    started = time.perf_counter()
    await asyncio.gather(*(person(c) for c in clients))
    elapsed = time.perf_counter() - started
    await closing(clients)
    turns = [t for c in clients for t in c.turns]
    got = latencies(turns)
    if topics:
        return {"recalling msgs/s": len(got["reply"]) / elapsed,
                "recalling send->reply p50 ms": ms(got["reply"], .5),
                "recalling send->reply p99 ms": ms(got["reply"], .99),
                **problems("recalling", clients, counts)}
    return {"EPC sustained msgs/s": len(got["reply"]) / elapsed,
            "EPC ack p50 ms": ms(got["ack"], .5), "EPC ack p99 ms": ms(got["ack"], .99),
            "EPC send->reply p50 ms": ms(got["reply"], .5),
            "EPC send->reply p99 ms": ms(got["reply"], .99),
            **problems("EPC", clients, counts)}


async def open_loop(port: int, secret: str, clients_n: int, rate: float, total: int) -> dict:
    """Part 2: TOTAL sends at RATE per second, round robin over the clients."""
    counts = Counts()
    clients = await connect_all(port, secret, clients_n, counts)
    turns: list[Turn] = []
    start = time.perf_counter() + 0.05
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        turns.append(clients[i % clients_n].send())
    offered = (total - 1) / max(1e-9, turns[-1].sent - turns[0].sent) if total > 1 else rate
    await wait_replies(turns, REPLY_TIMEOUT)
    await closing(clients)
    got = latencies(turns)
    return {"open loop offered turns/s": offered,
            "open loop send->reply p50 ms": ms(got["reply"], .5),
            "open loop send->reply p99 ms": ms(got["reply"], .99),
            **problems("open loop", clients, counts)}


async def first_chunk(port: int, secret: str, messages: int) -> dict:
    """Part 3: one client, one message at a time: send -> first "chunk"."""
    counts = Counts()
    [client] = await connect_all(port, secret, 1, counts)
    for _ in range(messages):
        await wait_replies([client.send()], REPLY_TIMEOUT)
    await closing([client])
    got = latencies(client.turns)
    return {"first chunk p50 ms": ms(got["chunk"], .5), "first chunk p99 ms": ms(got["chunk"], .99),
            "first chunk missing": len(client.turns) - len(got["chunk"])}


# -- in-process parts, in a child running the chosen tree's kernel ---------------------

async def telegram_figures(chats: int, count: int) -> dict:
    """Part 4: bench_bridge's Telegram run through the kernel, duplicates counted."""
    from bench_bridge import TOKEN, Conversations, FakeBotApi, through_kernel
    from opencortex.bridges.settings import TelegramSettings
    from opencortex.bridges.telegram import TelegramPlatform

    class Counted(Conversations):
        duplicated = 0

        def on_sent(self, sent) -> None:
            text = sent.text.removeprefix(self.prefix)
            seen = self.__dict__.setdefault("seen", set())
            if text in self.sent_at and text in seen:
                self.duplicated += 1
                return
            seen.add(text)
            super().on_sent(sent)

    fake = FakeBotApi(TOKEN)
    url = await fake.start()
    settings = TelegramSettings(enabled=True, base_url=url, poll_timeout=1,
                                allow=[str(c) for c in range(1, chats + 1)],
                                messages_per_minute=600)
    people = Counted(fake, chats, count, "[Echo] ")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-load-telegram-") as home:
            got = await asyncio.wait_for(through_kernel(TelegramPlatform(settings, TOKEN),
                                                        settings, Path(home), people),
                                         PART_TIMEOUT)
    finally:
        await fake.stop()
    return {"Telegram msgs/s": got["msgs/s"], "Telegram send->reply p50 ms": got["p50 ms"],
            "Telegram send->reply p99 ms": got["p99 ms"], "Telegram lost": got["lost"],
            "Telegram duplicated": people.duplicated,
            "Telegram misrouted": got["misrouted"] + got["out of order"]}


def echo_turn_figures(turns: int) -> dict:
    """Part 5: bench_core's whole echo turn (its printed p50/p99 read back)."""
    from bench_core import bench_kernel
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench_kernel(turns)
    figures = {}
    for label, key in (("whole turn", "echo turn"), ("the rest", "echo turn overhead")):
        found = re.search(rf"{label}.*?p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms", printed.getvalue())
        if found:
            figures[f"{key} p50 ms"], figures[f"{key} p99 ms"] = map(float, found.groups())
    return figures


def in_process(chats: int, count: int, turns: int) -> None:
    """The child's work: parts 4 and 5, printed as one JSON line."""
    figures = asyncio.run(telegram_figures(chats, count))
    figures.update(echo_turn_figures(turns))
    print("FIGURES " + json.dumps(figures))


def child_figures(tree: Path | None, chats: int, count: int, turns: int) -> dict:
    """Parts 4 and 5 in a child process whose `opencortex` is TREE's."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "kernel"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--in-process",
                           str(chats), str(count), str(turns)], capture_output=True,
                          text=True, env=env, timeout=PART_TIMEOUT + 60, cwd=HERE)
    for line in done.stdout.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line.removeprefix("FIGURES "))
    raise RuntimeError(f"in-process parts failed ({tree}): {done.stderr[-2000:]}")


def port_line_figures(tree: Path | None, runs: int) -> dict:
    """Part 6: bench_startup's start, warm cache; seconds to the port line."""
    from bench_startup import start_once
    with tempfile.TemporaryDirectory(prefix="bench-load-start-") as scratch:
        root = Path(scratch)
        (root / "home").mkdir()
        start_once(root, "warm", tree)             # fills the skill cache
        times = [start_once(root, "warm", tree) for _ in range(runs)]
    return {"port line p50 s": statistics.median(t[0] for t in times),
            "first answer p50 s": statistics.median(t[1] for t in times)}


# -- the run: sizes, trees, rounds, printing ---------------------------------------------

FULL = dict(clients=20, messages=50, rate=200.0, offered=1000, chunks=200, chats=100,
            chat_messages=10, turns=500, starts=5, steady=5.0)
QUICK = dict(clients=3, messages=5, rate=200.0, offered=20, chunks=10, chats=5,
             chat_messages=3, turns=20, starts=1, steady=0.3)


async def served_parts(kernels: list[ServedKernel], size: dict) -> list[dict]:
    """Parts 1-4 on each kernel, part by part, kernel after kernel."""
    results: list[dict] = [{} for _ in kernels]
    secrets = [k.secret() for k in kernels]
    for kernel, secret in zip(kernels, secrets):
        await asyncio.wait_for(warm_up(kernel.port, secret), PART_TIMEOUT)
    parts = (lambda p, s: closed_loop(p, s, size["clients"], size["messages"]),
             lambda p, s: open_loop(p, s, size["clients"], size["rate"], size["offered"]),
             lambda p, s: first_chunk(p, s, size["chunks"]),
             lambda p, s: closed_loop(p, s, size["clients"], size["messages"], topics=True))
    turns = size["clients"] * size["messages"]
    for number, part in enumerate(parts):
        for result, kernel, secret in zip(results, kernels, secrets):
            used, children = kernel.cpu_seconds(), kernel.children_cpu_seconds()
            result.update(await asyncio.wait_for(part(kernel.port, secret), PART_TIMEOUT))
            if number in (0, 3):
                name = "EPC" if number == 0 else "recalling"
                result[f"{name} kernel CPU ms/turn"] = \
                    1000 * (kernel.cpu_seconds() - used) / turns
                result[f"{name} writer process CPU ms/turn"] = \
                    1000 * (kernel.children_cpu_seconds() - children) / turns
    return results


def one_round(trees: list[Path | None], size: dict) -> list[dict]:
    """Every part once for each tree (kernels up together, parts alternated)."""
    with contextlib.ExitStack() as stack:
        kernels = []
        for tree in trees:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-load-")))
            kernels.append(ServedKernel(root, tree))
            stack.callback(kernels[-1].stop)
        results = asyncio.run(served_parts(kernels, size))
    for result, tree in zip(results, trees):
        result.update(child_figures(tree, size["chats"], size["chat_messages"], size["turns"]))
    for result, tree in zip(results, trees):
        result.update(port_line_figures(tree, size["starts"]))
    return results


def combine(rounds: list[dict]) -> dict:
    """Counts summed over rounds, everything else the median."""
    combined = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if key in r]
        counted = key.endswith(COUNTS) or key.endswith("missing")
        combined[key] = sum(values) if counted else statistics.median(values)
    return combined


def target_of(key: str) -> str:
    """KEY's target as printed ("" when it has none)."""
    if key in TARGETS:
        sign, value = TARGETS[key]
        return f"{'≥' if sign == '>=' else '≤'} {value:g}"
    return "0" if key.endswith(COUNTS) or key.endswith("missing") else ""


def met(key: str, value: float) -> str:
    """"ok" or "MISSED" for KEY's VALUE against its target ("" when it has none)."""
    if key in TARGETS:
        sign, bound = TARGETS[key]
        return "ok" if (value >= bound if sign == ">=" else value <= bound) else "MISSED"
    if key.endswith(COUNTS) or key.endswith("missing"):
        return "ok" if value == 0 else "MISSED"
    return ""


def show(figures: list[dict], names: list[str], size: dict, rounds: int) -> None:
    """Print one column of FIGURES per tree (and the ratio of two)."""
    print(f"concurrent load, echo backend, {rounds} round(s): EPC {size['clients']} clients x "
          f"{size['messages']} messages; open loop {size['offered']} turns at "
          f"{size['rate']:g}/s; first chunk over {size['chunks']} messages (at the EPC client, "
          f"the closest proxy for 'visible in Emacs'); Telegram {size['chats']} chats x "
          f"{size['chat_messages']}; {size['turns']} in-process turns; {size['starts']} starts")
    width = max(len(k) for k in figures[0]) + 2
    head = f"{'figure':<{width}}{'target':>9}" + "".join(f"{n:>16}" for n in names)
    print(head + ("   ratio" if len(names) == 2 else "") + "  target met")
    for key in figures[0]:
        values = [f.get(key, float("nan")) for f in figures]
        line = f"{key:<{width}}{target_of(key):>9}" + "".join(f"{v:>16.3f}" for v in values)
        if len(values) == 2:
            line += f"  {values[1] / values[0]:6.2f}" if values[0] else "       -"
        print(line + "  " + " / ".join(filter(None, (met(key, v) for v in values))))


def stop_on_signal(number, frame) -> None:
    """SIGTERM ends the run through `finally`, so the kernels started are stopped."""
    raise SystemExit(f"stopped by signal {number}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, tiny sizes")
    parser.add_argument("--tree", type=Path, action="append",
                        help="run the kernel of this source tree (twice: compare two)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds; medians are printed")
    parser.add_argument("--in-process", nargs=3, type=int, metavar=("CHATS", "COUNT", "TURNS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        in_process(*args.in_process)
        return
    signal.signal(signal.SIGTERM, stop_on_signal)      # so every kernel started is stopped
    trees = [t.resolve() for t in args.tree] if args.tree else [None]
    for tree in trees:
        if tree is not None and not (tree / "kernel" / "opencortex").is_dir():
            parser.error(f"{tree} has no kernel/opencortex: not a source tree of opencortex")
    names = [t.name if t else "this checkout" for t in trees]
    size = QUICK if args.quick else FULL
    steadiness = [cpu_steadiness(size["steady"])]
    rounds = []
    for number in range(args.rounds):
        order = list(range(len(trees)))[::-1 if number % 2 else 1]  # alternate who goes first
        got = one_round([trees[i] for i in order], size)
        rounds.append([got[order.index(i)] for i in range(len(trees))])
    steadiness.append(cpu_steadiness(size["steady"]))
    show([combine([r[i] for r in rounds]) for i in range(len(trees))], names, size, args.rounds)
    show_steadiness(steadiness, size["steady"])


def show_steadiness(readings: list[dict], seconds: float) -> None:
    """Print the machine's own stalls, measured before and after the run (see
    `figures.cpu_steadiness`): p99 figures hold them."""
    said = "; ".join(f"{when} {r['stalls']:.0f} in {seconds:g} s "
                     f"(worst {r['worst slowdown']:.0f}x)"
                     for when, r in zip(("before", "after"), readings))
    print(f"machine stalls with no load of ours (a {readings[0]['piece ms']:.1f} ms piece of "
          f"work {SLOW_FACTOR}x slower or worse): {said}; the p99 figures above hold "
          "such stalls")


if __name__ == "__main__":
    main()
