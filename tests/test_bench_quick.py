"""Every benchmark still runs: each bench/bench_*.py in its `--quick` mode (issue 8 §9).

A benchmark prints figures and asserts nothing, so one that no longer runs (a
renamed config key, a changed API) would go unnoticed; here it fails a test.
Each runs in a process group of its own, stopped whole if it overruns.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(BENCH.glob("bench_*.py"))
TIMEOUT = 180  # seconds; a quick mode takes a few
FIGURE = re.compile(r"\d+(\.\d+)?")  # a number: what every benchmark prints
NEEDS = {"bench_emacs.py": "emacs"}  # programs a benchmark cannot run without


def run_quick(script: Path) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT --quick; stop its whole process group if it overruns."""
    process = subprocess.Popen([sys.executable, str(script), "--quick"], cwd=BENCH,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{script.name} --quick ran past {TIMEOUT} s:\n{out[-2000:]}\n{err[-2000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_benchmark_quick_mode_runs_and_prints_figures(script):
    needed = NEEDS.get(script.name)
    if needed and shutil.which(needed) is None:
        pytest.skip(f"{script.name} needs {needed}, which is not installed")
    result = run_quick(script)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stderr[-3000:]}"
    assert FIGURE.search(result.stdout), f"{script.name} printed no figures:\n{result.stdout}"
