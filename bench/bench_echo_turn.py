"""The whole echo turn of this checkout against another's, in alternating rounds (a
script, not a test): prints figures, asserts nothing.

    python bench/bench_echo_turn.py --against /tmp/old       # 4 rounds of 500 turns each
    python bench/bench_echo_turn.py --against /tmp/old --rounds 8
    python bench/bench_echo_turn.py --quick                  # this checkout against itself
    python bench/bench_echo_turn.py --against /tmp/old --long  # one thread, a long context

Issues 13 and 14 set the echo turn's target as p50 <= 2 ms where the main they were
filed on took 4.7 ms: a ratio of 0.43.  This machine's speed drifts by a third within
an hour, so two kernels measured minutes apart say little.  Here each round runs both,
one after the other in fresh processes (which goes first alternates), each as
`bench_core` runs its whole turn (echo backend, serve's thread placement and collector
settings, 20 turns to warm up), and prints both p50s, the CPU a turn took and their
ratio; then the median ratio of the rounds.  Against itself (no --against) the ratios
say how far noise alone moves them.

With --long the turns are of one thread after LONG_WARM_UP turns of it: its context
then holds hundreds of messages (what a turn costs must not grow with them) and its
archive thousands (recall ranks more matches; that grows, as ranking does).

A checkout from before `opencortex.eventloop`, `placement` or `settle_collector` is
measured as its own serve ran then (asyncio's loop, threads anywhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from figures import percentile

HERE = Path(__file__).resolve()
CHECKOUT = HERE.parents[1]
WARM_UP = 20            # turns before the measured ones, as bench_core
THREADS = 10            # threads taking turns, as bench_core
LONG_WARM_UP = 1000     # --long: turns of its one thread before the measured ones
LONG_TURNS = 250        # --long: turns measured
TIMEOUT = 600           # seconds one measuring process may take


async def echo_turns(kernel, count: int, threads: int = THREADS, start: int = 0
                     ) -> list[float]:
    """Seconds of each of COUNT chat turns through KERNEL, one after the other, THREADS
    threads taking turns, each message numbered from START and naming one of seven
    topics (bench_core's)."""
    from opencortex.events import chat_message
    times = []
    for i in range(start, start + count):
        started = time.perf_counter()
        await kernel.handle(chat_message(f"message {i} about topic {i % 7}", "cli",
                                         f"bench{i % threads}"))
        times.append(time.perf_counter() - started)
    return times


def place_as_serve(config) -> Callable[[], None] | None:
    """The kernel's threads on one CPU as serve places them, when CONFIG asks for it; the
    function that lets them go again, or None when nothing was placed (a kernel from
    before `placement` leaves them anywhere, as its own serve did)."""
    try:
        from opencortex.placement import PLACEMENT, on_one_cpu
    except ImportError:
        return None
    return PLACEMENT.release if on_one_cpu(config) and PLACEMENT.place() else None


def settle_as_serve() -> None:
    """Python's collector settled as serve settles it once its kernel is built (a kernel
    from before `settle_collector`: left as it is, as its own serve did)."""
    try:
        from opencortex.serve import settle_collector
    except ImportError:
        return
    settle_collector()


def measure(count: int, threads: int = THREADS, warm_up: int = WARM_UP) -> dict[str, float]:
    """COUNT whole echo turns (of THREADS threads, after WARM_UP turns) of the kernel
    this process imports, in a fresh home: p50 and p99 seconds, and the CPU seconds of
    the process a turn (every thread's)."""
    from opencortex.config import load_config
    from opencortex.runtime import build_kernel
    try:
        from opencortex.eventloop import run
    except ImportError:                 # a kernel from before it: asyncio's own loop
        def run(main):
            return asyncio.run(main)
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(Path(tmp))
        kernel = build_kernel(config, writer=lambda text: None)
        release = place_as_serve(config)
        settle_as_serve()
        run(echo_turns(kernel, warm_up, threads))
        cpu = time.process_time()
        times = run(echo_turns(kernel, count, threads, start=warm_up))
        cpu = time.process_time() - cpu
        if hasattr(kernel, "aclose"):
            run(kernel.aclose())
        if release is not None:
            release()
    return {"p50": percentile(times, .5), "p99": percentile(times, .99), "cpu": cpu / count}


def measured(checkout: Path, count: int, long: bool = False) -> dict[str, float]:
    """`measure` run in a fresh process importing CHECKOUT's kernel (LONG: --long's)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(checkout / "kernel"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(HERE), "--measure", str(count),
                           *(["--long"] if long else [])],
                          cwd=HERE.parent, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    if done.returncode != 0:
        raise SystemExit(f"measuring {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def compare(other: Path, rounds: int, count: int, long: bool = False) -> None:
    """ROUNDS rounds of COUNT turns (LONG: --long's) of this checkout and of OTHER;
    print each and the median ratio."""
    how = (f"one thread after {LONG_WARM_UP} turns of it" if long
           else f"{THREADS} threads taking turns")
    print(f"whole echo turn, {count} turns a run ({how}): this checkout ({CHECKOUT}) "
          f"against {other}")
    ratios = []
    for number in range(rounds):
        if number % 2 == 0:             # which goes first alternates
            ours = measured(CHECKOUT, count, long)
            theirs = measured(other, count, long)
        else:
            theirs = measured(other, count, long)
            ours = measured(CHECKOUT, count, long)
        ratios.append(ours["p50"] / theirs["p50"])
        print(f"  round {number + 1}: this p50 {ours['p50'] * 1e3:6.3f} ms "
              f"(p99 {ours['p99'] * 1e3:6.3f}, CPU {ours['cpu'] * 1e3:5.2f} ms a turn)   "
              f"other p50 {theirs['p50'] * 1e3:6.3f} ms (p99 {theirs['p99'] * 1e3:6.3f}, "
              f"CPU {theirs['cpu'] * 1e3:5.2f})   ratio {ratios[-1]:.2f}")
    print(f"  median ratio of p50s: {statistics.median(ratios):.2f}" + (
        "" if long else "  (issues 13/14: 2 of 4.7 ms, 0.43, against the main they were "
        "filed on)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path,
                        help="the other checkout (default: this one, for the noise floor)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--turns", type=int, help="turns a run (default 500; --long: "
                        f"{LONG_TURNS})")
    parser.add_argument("--long", action="store_true",
                        help=f"one thread, measured after {LONG_WARM_UP} turns of it")
    parser.add_argument("--quick", action="store_true", help="one round of 50 turns")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)   # the child's part
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, 1, LONG_WARM_UP) if args.long
                         else measure(args.measure)))
        return
    other = args.against.resolve() if args.against else CHECKOUT
    if not (other / "kernel" / "opencortex").is_dir():
        raise SystemExit(f"{other} is not an opencortex checkout (no kernel/opencortex)")
    turns = 50 if args.quick else args.turns or (LONG_TURNS if args.long else 500)
    compare(other, 1 if args.quick else args.rounds, turns, args.long)


if __name__ == "__main__":
    main()
