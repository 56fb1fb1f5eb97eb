"""Where serve's threads run: together on one CPU, or anywhere (`cpu` in the configuration).

A turn goes from the event loop to a reading thread and back (recall, the
prompt), to a judging thread and back (the verdict), and to the archive writer
and back: six hand-offs.  Only one of those threads runs Python at a time (the
GIL), so spreading them over CPUs gains little, and every hand-off to a thread
asleep on another CPU wakes that CPU first: on the 2-core VM the figures come
from, ~50-75 µs a trip.  On one CPU a hand-off is a switch.  Measured there
(`bench_core`'s echo turn, p50, 8 runs measuring both): 3.36 -> 2.93 ms; under
bench_load's 20 EPC clients (3 rounds, the kernel before and after) 379 -> 522
turns/s at 2.42 -> 1.72 ms of CPU a turn.

One CPU must not become a trap, so `Placement.watch` looks at the CPUs every
WATCH_EVERY seconds (/proc/stat, and the kernel's own time in /proc/self/stat):
when other work keeps the kernel's CPU busier than BUSY_SHARE of the time and
another CPU the kernel may use is idler by MARGIN, every thread moves there.
Children (shell commands, MCP servers, the archive's write process) start
with every CPU the kernel was given (`children`): they are not the kernel's to
keep (a skill or tool that starts a process itself does so inside
`children()` too, or its process shares the kernel's CPU).  Threads started
later inherit their starter's CPU.

`cpu = "auto"` (the default) places the threads unless an embedding model
runs in the kernel (`[memory.embeddings] model`): its library spreads one
batch over threads of its own, which would then share the one CPU.  `"one"`
places them anyway, `"any"` never.  Linux only (sched_setaffinity, /proc);
elsewhere, or with one CPU to use, nothing is placed.  Placing is serve's
(and bench_core's, to measure what serve runs); the terminal chat, and a
kernel built in-process by a test or an embedding program, are left where
they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opencortex.config import Config

log = logging.getLogger(__name__)

WATCH_EVERY = 1.0        # seconds between looks at the CPUs
BUSY_SHARE = 0.5         # others' share of the kernel's CPU that makes it look elsewhere
MARGIN = 0.25            # how much idler another CPU must be to move there


def on_one_cpu(config: Config) -> bool:
    """Whether CONFIG asks for the kernel's threads on one CPU (see the module notes)."""
    if config.cpu == "auto":
        return config.memory.embeddings.model is None
    return config.cpu == "one"


@dataclass(frozen=True)
class CpuTimes:
    """Clock ticks since boot: each CPU's (busy, total), and the kernel process's own."""

    cpus: dict[int, tuple[int, int]]
    own: int


def cpu_times(stat: str, own_stat: str) -> CpuTimes:
    """CpuTimes from the text of /proc/stat and of /proc/self/stat.  Busy is all but
    idle and iowait (steal counts as busy: the CPU was not ours to use)."""
    cpus = {}
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(value) for value in rest.split()]
            idle = sum(ticks[3:5])
            cpus[int(name[3:])] = (sum(ticks[:8]) - idle, sum(ticks[:8]))
    fields = own_stat.rpartition(")")[2].split()
    return CpuTimes(cpus, int(fields[11]) + int(fields[12]))    # utime + stime


def others_share(before: CpuTimes, after: CpuTimes, cpu: int) -> float:
    """The share of the time between BEFORE and AFTER that CPU spent on work other
    than the kernel's (which all ran there)."""
    busy, total = _delta(before, after, cpu)
    return max(0, busy - (after.own - before.own)) / total if total > 0 else 0.0


def idler_cpu(before: CpuTimes, after: CpuTimes, cpu: int, allowed: frozenset[int]
              ) -> int | None:
    """Where the kernel on CPU should move, going by what each CPU of ALLOWED did between
    BEFORE and AFTER: the idlest other CPU when others kept CPU busier than
    BUSY_SHARE and that one is idler by MARGIN; else None (stay)."""
    others = others_share(before, after, cpu)
    if others <= BUSY_SHARE:
        return None
    shares = {}
    for other in sorted(allowed - {cpu}):
        busy, total = _delta(before, after, other)
        if total > 0:
            shares[other] = busy / total
    if not shares:
        return None
    idlest = min(shares, key=shares.__getitem__)
    return idlest if shares[idlest] + MARGIN < others else None


def _delta(before: CpuTimes, after: CpuTimes, cpu: int) -> tuple[int, int]:
    old, new = before.cpus.get(cpu), after.cpus.get(cpu)
    if old is None or new is None:
        return 0, 0
    return new[0] - old[0], new[1] - old[1]


def read_cpu_times() -> CpuTimes:
    """The CPU times now (see `cpu_times`)."""
    with open("/proc/stat") as stat, open("/proc/self/stat") as own:
        return cpu_times(stat.read(), own.read())


def current_cpu() -> int:
    """The CPU the calling thread last ran on (/proc/thread-self/stat, field 39)."""
    with open("/proc/thread-self/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[36])


def thread_ids() -> list[int]:
    """The ids of this process's threads."""
    return [int(name) for name in os.listdir("/proc/self/task")]


@dataclass
class Placement:
    """The kernel's threads on one CPU of ALLOWED (the CPUs the process was given)."""

    allowed: frozenset[int]
    cpu: int | None = None                  # None: not placed
    moves: int = 0                          # moves made by `watch`
    _lent: int = 0                          # `children` blocks open, in all threads
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _depth: threading.local = field(default_factory=threading.local)   # .value: blocks open here
    _placed: set[int] = field(default_factory=set)                      # thread ids, last set

    def place(self, cpu: int | None = None) -> bool:
        """Put every thread on CPU (default: the one this thread runs on); False when
        there is nothing to place (one CPU to use, or no way to place)."""
        if len(self.allowed) < 2:
            return False
        try:
            cpu = current_cpu() if cpu is None else cpu
            if cpu not in self.allowed:
                cpu = min(self.allowed)
            self._set_all({cpu})
        except OSError as error:
            log.info("kernel threads left on any CPU (%s)", error.strerror or error)
            return False
        self.cpu = cpu
        return True

    def report(self) -> str:
        """Where the threads are, for /metrics and doctor."""
        if self.cpu is None:
            return "any CPU"
        return f"on CPU {self.cpu} (one of {len(self.allowed)}), moved {self.moves} times"

    def release(self) -> None:
        """Every thread back on every allowed CPU."""
        if self.cpu is not None:
            self.cpu = None
            with contextlib.suppress(OSError):
                self._set_all(self.allowed)

    def move_if_busy(self, before: CpuTimes, after: CpuTimes) -> bool:
        """Move to an idler CPU if the times BEFORE and AFTER say so; whether it moved.
        Staying, threads started since the last look are put on the CPU too (one
        started inside a `children` block kept every CPU)."""
        with self._guard:
            if self.cpu is None or self._lent:
                return False
            target = idler_cpu(before, after, self.cpu, self.allowed)
            if target is None:
                if set(thread_ids()) != self._placed:
                    with contextlib.suppress(OSError):
                        self._set_all({self.cpu})
                return False
            log.info("other work keeps CPU %d busy; kernel threads move to CPU %d",
                     self.cpu, target)
            moved = self.place(target)
            self.moves += moved
            return moved

    async def watch(self, every: float = WATCH_EVERY) -> None:
        """Look at the CPUs every EVERY seconds and move when another is idler (until
        released or cancelled)."""
        try:
            before = read_cpu_times()
            while self.cpu is not None:
                await asyncio.sleep(every)
                after = read_cpu_times()
                self.move_if_busy(before, after)
                before = after
        except OSError as error:                     # /proc unreadable: stay where we are
            log.warning("CPU times cannot be read (%s); kernel threads stay on CPU %s",
                        error.strerror or error, self.cpu)

    @contextlib.contextmanager
    def children(self) -> Iterator[None]:
        """A block whose child processes start on every allowed CPU: the calling thread
        is on them while any such block of its is open (blocks of coroutines on one
        loop may end in any order), and `watch` makes no move meanwhile."""
        self._open(+1)
        try:
            yield
        finally:
            self._open(-1)

    def _open(self, step: int) -> None:
        """Count a `children` block of this thread opened (+1) or closed (-1); the
        thread goes on every CPU with its first and back with its last."""
        with self._guard:
            open_here = getattr(self._depth, "value", 0) + step
            self._depth.value = open_here
            self._lent += step
            if self.cpu is not None and open_here == (1 if step > 0 else 0):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, self.allowed if step > 0 else {self.cpu})

    def _set_all(self, cpus: set[int] | frozenset[int]) -> None:
        """CPUS for every thread of this process (one that ended meanwhile is skipped)."""
        placed = set()
        for tid in thread_ids():
            try:
                os.sched_setaffinity(tid, cpus)
                placed.add(tid)
            except ProcessLookupError:
                pass
        self._placed = placed


def _allowed() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):       # not Linux
        return frozenset()


PLACEMENT = Placement(_allowed())      # the process's: its threads share one affinity


def children() -> contextlib.AbstractContextManager[None]:
    """See `Placement.children` (the process's placement)."""
    return PLACEMENT.children()
