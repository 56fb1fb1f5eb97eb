"""Shell actuator benchmark (a script, not a test): prints figures, asserts nothing.

    python bench/bench_shell.py
    python bench/bench_shell.py --quick   # a few seconds: 5 runs, 40 MB of output

Figures:
- cost of one approved command that does nothing (`true`), p50 over 30 runs:
  what running a command under the reaper adds per command;
- seconds past a 1 s timeout before the turn ends when a grandchild calls
  `setsid` (`setsid sleep 8` here, so the old behaviour stays measurable):
  target < 0.5 s;
- peak resident memory growth of this process while a command writes 400 MB
  (`head -c 400000000 /dev/zero`), and how long the turn took: target a few MB.
Each case also says whether a process it started is still running afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from opencortex.actions import ShellCommand
from opencortex.actuators.shell import ShellActuator
from opencortex.approvals import ApprovalDecision
from opencortex.config import ShellSettings
from opencortex.reader import Keyword

YES = ApprovalDecision("approved")


def command(argv: list[str]) -> ShellCommand:
    """An approved-shell action for ARGV."""
    return ShellCommand(type=Keyword("request"), target=Keyword("shell"), cmd=argv)


def run_once(settings: ShellSettings, argv: list[str]) -> tuple[float, str]:
    """Seconds one approved run of ARGV takes, and its result."""
    shell = ShellActuator(settings, Path(tempfile.gettempdir()))
    started = time.perf_counter()
    outcome = asyncio.run(shell.run_approved(command(argv), YES))
    return time.perf_counter() - started, outcome.result or ""


def processes_with(marker: str) -> list[int]:
    """Pids whose command line mentions MARKER."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def memory_kb(field: str) -> int:
    """FIELD (VmRSS, VmHWM) of this process from /proc/self/status, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def bench_start_cost(runs: int = 30) -> None:
    """p50 of an approved `true`."""
    seconds = [run_once(ShellSettings(), ["true"])[0] for _ in range(runs)]
    print(f"approved `true`: p50 {statistics.median(seconds) * 1000:.1f} ms")


def bench_setsid_escape() -> None:
    """Seconds past a 1 s timeout with a `setsid` grandchild."""
    marker = f"8.{uuid.uuid4().int % 10**6:06d}"
    seconds, _ = run_once(ShellSettings(timeout=1.0),
                          ["sh", "-c", f"setsid sleep {marker} & sleep {marker}"])
    left = processes_with(marker)
    print(f"setsid grandchild, 1 s timeout: {seconds - 1.0:.2f} s past the timeout, "
          f"{len(left)} process(es) left running")
    for pid in left:
        os.kill(pid, 9)


def bench_big_output(megabytes: int = 400) -> None:
    """Peak RSS growth while a command writes MEGABYTES MB."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = memory_kb("VmRSS")
    seconds, result = run_once(ShellSettings(timeout=120.0),
                               ["head", "-c", str(megabytes * 1_000_000), "/dev/zero"])
    grown = (memory_kb("VmHWM") - before) / 1024
    note = result.rsplit("\n", 1)[-1]
    print(f"{megabytes} MB of output: peak RSS +{grown:.1f} MB, {seconds:.2f} s; {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 runs, 40 MB of output")
    quick = parser.parse_args().quick
    bench_start_cost(5 if quick else 30)
    bench_setsid_escape()
    bench_big_output(40 if quick else 400)


if __name__ == "__main__":
    main()
