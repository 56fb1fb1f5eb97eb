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
