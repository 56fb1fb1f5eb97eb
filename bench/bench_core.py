"""Benchmark figures for the kernel core (a script, not a test): prints, asserts nothing.

    python bench/bench_core.py            # 1k and 100k archived messages
    python bench/bench_core.py --million  # also 1M (takes a while and ~1 GB of disk)
    python bench/bench_core.py --quick    # a few seconds: 1k only, short runs

Figures:
- reader throughput against bare sexpdata: a ~500-byte plist and a 100 KB reply;
- archive cost per appended turn at 1k and 100k (and 1M) archived messages, and the
  ratio (target: 100k/1k <= 1.2);
- kernel overhead per turn with the echo backend: p50/p99 of the whole turn (target:
  p50 <= 2 ms), and of the turn without the archive's fsync'd append and recall; the
  whole turn also with its files written by a child process (`[memory] write_process`);
- time to load all bundled skills cold (in a fresh interpreter).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sexpdata

from bench_echo_turn import WARM_UP, echo_turns, place_as_serve, settle_as_serve
from figures import percentile, thread_cpu, timed
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.reader import read_plist

SMALL = ('(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*opencortex-chat*" '
         ':text "* Reply\\nThe kernel reads this plist as data, checks it against typed '
         'action models and every skill\'s verifier, and only then lets an actuator insert it '
         'into the chat buffer. Nothing in it is ever evaluated; a quote \\" or a backslash '
         '\\\\ stays text. This sentence pads the reply to about five hundred bytes, which is '
         'a typical answer of a chat model asked a short question.")')
LARGE = ('(:type :REQUEST :target :cli :text "'
         + ("Line with \\\"quotes\\\" and \\\\ backslashes, tabs\\t and text. " * 1700)[:100_000]
         + '")')


def rate(function, text: str, seconds: float = 1.0) -> float:
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        function(text)
        count += 1
    return count / (time.perf_counter() - started)


def bench_reader(seconds: float = 1.0) -> None:
    print("reader (forms/s)            opencortex.reader   bare sexpdata   ratio")
    for label, text in (("~500-byte plist", SMALL), ("100 KB reply", LARGE)):
        ours = rate(read_plist, text, seconds)
        bare = rate(lambda t: sexpdata.loads(t, nil=None, true=None), text, seconds)
        print(f"  {label:<25} {ours:>16,.0f} {bare:>15,.0f} {ours / bare:>7.2f}")


def fill(archive: Archive, total: int, threads: int = 100) -> None:
    """Archive TOTAL messages across THREADS threads, in large batches."""
    batch = 1000
    for start in range(0, total, batch):
        archive.append([
            NewMessage(role="user" if i % 2 == 0 else "assistant",
                       text=f"archived message {i} about topic {i % 97} and more words",
                       thread=Thread("cli", f"t{i % threads}"))
            for i in range(start, min(start + batch, total))])


def append_cost(archive: Archive, turns: int = 300) -> float:
    """Median seconds to append one two-message turn."""
    times = []
    for i in range(turns):
        thread = Thread("cli", f"t{i % 100}")
        pair = [NewMessage(role="user", text=f"question {i}", thread=thread),
                NewMessage(role="assistant", text=f"answer {i}", thread=thread)]
        started = time.perf_counter()
        archive.append(pair)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_archive(sizes: list[int], turns: int = 300) -> None:
    print("archive: median cost of appending one turn (2 messages, lock + write + fsync + index)")
    costs = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            archive = Archive(Path(tmp))
            started = time.perf_counter()
            fill(archive, size)
            filled = time.perf_counter() - started
            costs[size] = append_cost(archive, turns)
            archive.close()
        print(f"  at {size:>9,} archived: {costs[size] * 1e3:7.3f} ms/turn  (fill took {filled:.1f} s)")
    base = costs[sizes[0]]
    for size in sizes[1:]:
        print(f"  ratio {size:,}/{sizes[0]:,}: {costs[size] / base:.2f}  (target <= 1.2)")


def until_durable(record: list[float], submit):
    """SUBMIT (the archive's group-commit path), adding to RECORD the seconds from each
    submission until its write is durable."""
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        future = submit(*args, **kwargs)
        future.add_done_callback(lambda _: record.append(time.perf_counter() - started))
        return future
    return wrapper


THREAD_ROLES = {"MainThread": "loop", "opencortex-reader": "reading",
                "opencortex-judge": "judging", "opencortex-archive-writer": "writing"}


def bench_kernel(turns: int = 500) -> None:
    """Whole turns with the echo backend, on the loop `serve` runs on (`event_loop`,
    uvloop where installed), and the same turns without the archive's locked, fsync'd
    append (submitted to the writer thread, until durable) and without recall (a
    same-owner FTS search, in a reading thread), which are measured apart, with the
    kernel's threads on one CPU as serve places them (`cpu`, see placement), the files
    written by the writer thread; then the whole turn on asyncio's own loop, with the
    threads on any CPU, and with the files written by a child process as serve has them
    written with `[memory] write_process = true` (its round trip adds to every turn),
    for comparison.  Then the CPU a turn used in each of the kernel's threads (the loop,
    the reading, judging and writing threads; /proc, Linux only): a turn is CPU-bound,
    so these add up to about its mean time, and say where it goes."""
    from opencortex.config import load_config
    from opencortex.eventloop import loop_factory, run
    from opencortex.runtime import build_kernel

    def whole_turns(choice: str | None, count: int, parts: bool = False,
                    placed: bool = True, child: bool = False):
        """COUNT turns' times on the loop CHOICE names (None: the configured one), the
        threads PLACED as serve places them (else on any CPU), the files written by a
        CHILD process (`[memory] write_process`; else by the writer thread), and with
        PARTS, their appends' and recalls' (else empty); that loop's name; whether
        they were placed; the CPU seconds a turn each thread used (see `thread_cpu`)."""
        with tempfile.TemporaryDirectory() as tmp:
            config = load_config(Path(tmp))
            choice = choice or config.event_loop
            kernel = build_kernel(config, writer=lambda text: None)
            release = place_as_serve(config) if placed else None
            placed = release is not None
            if child:
                kernel.archive.write_in_a_process()
                if not kernel.archive._write_process.wait_ready(30):
                    raise RuntimeError("the archive's write process did not start")
            thresholds = gc.get_threshold()
            settle_as_serve()
            run(echo_turns(kernel, WARM_UP), choice)  # warm up
            appends: list[float] = []
            recalls: list[float] = []
            if parts:
                if hasattr(kernel.archive, "submit"):  # the writer thread (older: append)
                    kernel.archive.submit = until_durable(  # type: ignore[method-assign]
                        appends, kernel.archive.submit)
                else:
                    kernel.archive.append = timed(  # type: ignore[method-assign]
                        appends, kernel.archive.append)
                recall = kernel.conversations.recall
                recall.recall = timed(recalls, recall.recall)  # type: ignore[method-assign]
            before = thread_cpu()
            whole = run(echo_turns(kernel, count), choice)
            after = thread_cpu()
            run(kernel.aclose(), choice)
            if release is not None:
                release()
            gc.unfreeze()
            gc.set_threshold(*thresholds)
        cpu = {name: (used - before.get(name, 0.0)) / count for name, used in after.items()}
        return (whole, appends, recalls, "uvloop" if loop_factory(choice) else "asyncio",
                placed, cpu)

    whole, appends, recalls, loop, placed, cpu = whole_turns(None, turns, parts=True)
    core = [t - a - r for t, a, r in zip(whole, appends, recalls)]
    where = "threads on one CPU" if placed else "threads on any CPU"
    print(f"kernel turn, echo backend ({turns} turns, on {loop}, {where}, files written by "
          "the writer thread: as serve runs it):")
    for label, values in (("whole turn", whole), ("archive append (fsync)", appends),
                          ("recall (FTS, same owner)", recalls),
                          ("the rest: kernel overhead", core)):
        print(f"  {label:<26} p50 {percentile(values, .5) * 1e3:7.3f} ms   "
              f"p99 {percentile(values, .99) * 1e3:7.3f} ms"
              + ("   (target: whole turn p50 <= 2 ms)" if label.startswith("the rest") else ""))
    if cpu:
        shown = {THREAD_ROLES.get(name, name): used for name, used in cpu.items() if used > 0}
        print(f"  {'CPU a turn, by thread':<26} " + ", ".join(
            f"{name} {used * 1e3:.2f}" for name, used in sorted(
                shown.items(), key=lambda item: -item[1])) +
            f" ms (sum {sum(shown.values()) * 1e3:.2f}; wall {statistics.mean(whole) * 1e3:.2f})")
    if loop != "asyncio":
        plain, *_ = whole_turns("asyncio", turns)
        print(f"  {'whole turn on asyncio':<26} p50 {percentile(plain, .5) * 1e3:7.3f} ms   "
              f"p99 {percentile(plain, .99) * 1e3:7.3f} ms")
    if placed:
        anywhere, *_ = whole_turns(None, turns, placed=False)
        print(f"  {'whole turn, any CPU':<26} p50 {percentile(anywhere, .5) * 1e3:7.3f} ms   "
              f"p99 {percentile(anywhere, .99) * 1e3:7.3f} ms")
    if hasattr(Archive, "write_in_a_process"):     # not in a kernel from before it (A/B)
        written, *_ = whole_turns(None, turns, child=True)
        print(f"  {'whole turn, write process':<26} "
              f"p50 {percentile(written, .5) * 1e3:7.3f} ms   "
              f"p99 {percentile(written, .99) * 1e3:7.3f} ms   ([memory] write_process)")


def bench_skill_load(runs: int = 3) -> None:
    code = ("import time; t = time.perf_counter(); "
            "from opencortex.config import load_config; from opencortex.runtime import load_skills; "
            "r = load_skills(load_config('/tmp/opencortex-bench-home')); "
            "print(len(r.skills), time.perf_counter() - t)")
    seconds = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True).stdout.split()
        seconds.append(float(out[1]))
    print(f"skills: {out[0]} loaded cold (fresh interpreter, imports included): "
          f"median {statistics.median(seconds) * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--million", action="store_true", help="also measure at 1M messages")
    parser.add_argument("--skip-archive", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds: short reader runs, 1k archive, 50 turns")
    args = parser.parse_args()
    bench_reader(0.2 if args.quick else 1.0)
    if not args.skip_archive:
        sizes = [1_000] if args.quick else [1_000, 100_000]
        bench_archive(sizes + ([1_000_000] if args.million else []), 50 if args.quick else 300)
    bench_kernel(50 if args.quick else 500)
    bench_skill_load(1 if args.quick else 3)


if __name__ == "__main__":
    main()
