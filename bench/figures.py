"""Small helpers the benchmark scripts share: percentiles, timing a function's calls, and
the CPU time each of this process's threads has used."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Callable

_NUMBERED = re.compile(r"_\d+$")       # "opencortex-reader_1": one of a pool


def percentile(values: list[float], share: float) -> float:
    """The value below which SHARE (0..1) of VALUES lie."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def timed(record: list[float], function: Callable) -> Callable:
    """FUNCTION, adding the seconds of each call to RECORD."""
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - started)
    return wrapper


def thread_cpu() -> dict[str, float]:
    """Seconds of CPU (user and system) each live thread of this process has used, by
    thread name, a pool's threads ("name_0", "name_1") counted together; {} where
    /proc is not there (Linux only).  Read from /proc/self/task/TID/stat, in clock
    ticks (10 ms): compare two readings over a run of a second or more."""
    names = {thread.native_id: _NUMBERED.sub("", thread.name)
             for thread in threading.enumerate()}
    try:
        tasks = list(Path("/proc/self/task").iterdir())
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return {}
    used: dict[str, float] = {}
    for task in tasks:
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:                 # the thread ended meanwhile
            continue
        name = names.get(int(task.name), "other")
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


STEADY_PIECE = 20_000       # iterations of the probe's piece of work (~1.3 ms here)
SLOW_FACTOR = 4             # a piece this many times slower than its median is a stall
STALL_GAP = 0.05            # seconds: slow pieces closer than this are one stall


def _piece() -> int:
    """A fixed piece of pure-Python work (no memory to speak of, no system calls)."""
    total = 0
    for number in range(STEADY_PIECE):
        total += number * number
    return total


def cpu_steadiness(seconds: float) -> dict[str, float]:
    """How steady this machine's CPU is, measured with nothing else of ours running: a
    fixed piece of work timed again and again for SECONDS (2 ms of sleep between two,
    so under half of one CPU), and the stalls: runs of pieces SLOW_FACTOR or more times
    slower than their median.  On the 2-core VM these figures come from, with no load
    of its own, both CPUs at once ran 4-16x slower for ~50-100 ms every second or two
    on some days (2026-11-29), none on others: a tail latency measured then holds those
    stalls, whatever the kernel.  Keys: "piece ms" (median), "stalls", "stalls/s",
    "worst slowdown"."""
    times: list[tuple[float, float]] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        _piece()
        times.append((started, time.perf_counter() - started))
        time.sleep(0.002)
    return stalls_in(times, seconds)


def stalls_in(times: list[tuple[float, float]], seconds: float) -> dict[str, float]:
    """`cpu_steadiness`'s figures from TIMES, (started, seconds taken) of each piece, over
    SECONDS: slow pieces less than STALL_GAP apart are one stall."""
    median = percentile([taken for _, taken in times], .5)
    slow = [started for started, taken in times if taken >= SLOW_FACTOR * median]
    stalls = sum(1 for i, started in enumerate(slow)
                 if i == 0 or started - slow[i - 1] > STALL_GAP)
    return {"piece ms": median * 1e3, "stalls": stalls, "stalls/s": stalls / seconds,
            "worst slowdown": max(taken for _, taken in times) / median}
