"""The kernel's threads on one CPU (opencortex.placement): placed, followed by new
threads, moved off a CPU other work keeps busy, and never passed on to children.

The threads are really placed (sched_setaffinity) and read back from the kernel;
CPU times come from the real /proc.  Only the choice of where to move is also
given times made up for it, so that each rule is seen on its own.  Every test
that places the test process's threads puts them back on every CPU after.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from epc.client import EPCClient

from opencortex.actuators.bounded import run_bounded
from opencortex.config import load_config
from opencortex.doctor import _cpu
from opencortex.memory import Archive
from opencortex.placement import (BUSY_SHARE, MARGIN, PLACEMENT, CpuTimes, Placement,
                                  idler_cpu, on_one_cpu, others_share, read_cpu_times,
                                  thread_ids)
from opencortex.serve_port import default_connection_file

from conftest import cli_env

ALLOWED = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2 or not Path("/proc/stat").exists(),
                                    reason="placing threads needs Linux and two CPUs")
AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


def affinities(pid: int | None = None) -> dict[int, frozenset[int]]:
    """Each thread of process PID (default: this one) and the CPUs it may run on."""
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    found = {}
    for tid in os.listdir(tasks):
        try:
            found[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
        except ProcessLookupError:
            pass
    return found


@pytest.fixture
def placement():
    """A placement of this process's threads, undone after the test."""
    placed = Placement(ALLOWED)
    yield placed
    placed.release()
    for tid in thread_ids():                       # whatever the test did
        try:
            os.sched_setaffinity(tid, ALLOWED)
        except ProcessLookupError:
            pass


def busy_share(before: CpuTimes, after: CpuTimes, cpu: int) -> float:
    """How busy CPU was between BEFORE and AFTER, whoever kept it so."""
    busy, total = (a - b for a, b in zip(after.cpus[cpu], before.cpus[cpu]))
    return busy / total if total else 0.0


def other_cpu(cpu: int) -> int:
    return min(ALLOWED - {cpu})


# -- placing ----------------------------------------------------------------------

@needs_two_cpus
def test_every_thread_goes_on_one_cpu_and_threads_started_later_follow(placement):
    gate = threading.Event()
    before = threading.Thread(target=gate.wait, args=(30,))
    before.start()
    try:
        cpu = max(ALLOWED)
        assert placement.place(cpu)
        assert placement.cpu == cpu
        assert set(affinities().values()) == {frozenset({cpu})}
        seen = {}
        later = threading.Thread(target=lambda: seen.update(cpus=os.sched_getaffinity(0)))
        later.start()
        later.join(10)
        assert seen["cpus"] == {cpu}
        assert placement.report() == f"on CPU {cpu} (one of {len(ALLOWED)}), moved 0 times"
        placement.release()
        assert set(affinities().values()) == {ALLOWED}
        assert placement.report() == "any CPU"
    finally:
        gate.set()
        before.join(10)


def test_with_one_cpu_to_use_nothing_is_placed():
    only = Placement(frozenset({0}))
    assert not only.place()
    assert only.cpu is None
    with only.children():
        pass                                       # nothing to lend either


def test_auto_places_the_threads_unless_an_embedding_model_runs_in_the_kernel(home):
    model = {"embeddings": {"model": "python:embedding_fixture:embed"}}
    assert on_one_cpu(load_config(home))
    assert not on_one_cpu(load_config(home, memory=model))
    assert on_one_cpu(load_config(home, cpu="one", memory=model))
    assert not on_one_cpu(load_config(home, cpu="any"))
    assert "an embedding model runs in the kernel" in _cpu(load_config(home, memory=model)).detail
    assert "any CPU" in _cpu(load_config(home, cpu="any")).detail
    if len(ALLOWED) > 1:
        assert "together on one CPU" in _cpu(load_config(home)).detail


# -- children -----------------------------------------------------------------------

@needs_two_cpus
def test_a_child_starts_on_every_cpu_while_the_kernel_stays_on_one(placement):
    cpu = min(ALLOWED)
    placement.place(cpu)
    pinned = subprocess.run([sys.executable, "-c", AFFINITY], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    assert json.loads(pinned) == [cpu]               # what `children` is there to avoid
    with placement.children():
        with placement.children():                   # nested: the outer block still lends
            pass
        free = subprocess.run([sys.executable, "-c", AFFINITY], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    assert json.loads(free) == sorted(ALLOWED)
    assert os.sched_getaffinity(0) == {cpu}          # the thread is back on its CPU
    assert set(affinities().values()) == {frozenset({cpu})}


@needs_two_cpus
def test_blocks_of_coroutines_ending_in_any_order_keep_children_off_the_kernels_cpu(placement):
    """Two MCP servers start at once on the loop's thread: the first block to open
    may be the first to close, and the other's child must still start on every CPU."""
    cpu = min(ALLOWED)
    placement.place(cpu)
    seen = {}

    async def starting(name: str, opened: asyncio.Event, close: asyncio.Event) -> None:
        with placement.children():
            opened.set()
            await close.wait()
            seen[name] = os.sched_getaffinity(0)

    async def interleaved():
        a_open, b_open, a_close, b_close = (asyncio.Event() for _ in range(4))
        first = asyncio.create_task(starting("first", a_open, a_close))
        await a_open.wait()
        second = asyncio.create_task(starting("second", b_open, b_close))
        await b_open.wait()
        a_close.set()
        await first                         # the first opened closes first
        b_close.set()
        await second

    for _ in range(2):                      # and again: nothing is left counted
        asyncio.run(asyncio.wait_for(interleaved(), 30))
        assert seen == {"first": ALLOWED, "second": ALLOWED}
        assert os.sched_getaffinity(0) == {cpu}


@needs_two_cpus
def test_no_move_is_made_while_a_child_is_being_started(placement):
    cpu = min(ALLOWED)
    placement.place(cpu)
    busy = CpuTimes({cpu: (0, 0), other_cpu(cpu): (0, 0)}, own=0)
    then = CpuTimes({cpu: (100, 100), other_cpu(cpu): (0, 100)}, own=0)
    with placement.children():
        assert not placement.move_if_busy(busy, then)
    assert placement.move_if_busy(busy, then)
    assert placement.cpu == other_cpu(cpu) and placement.moves == 1
    assert set(affinities().values()) == {frozenset({other_cpu(cpu)})}


@needs_two_cpus
def test_a_shell_command_and_the_archive_write_process_run_on_every_cpu(placement, tmp_path):
    """The process's own placement, as serve uses it: what the shell tool runs (under
    its reaper) and the archive's write process are not held to the kernel's CPU."""
    assert PLACEMENT.place(min(ALLOWED))
    try:
        finished = asyncio.run(run_bounded([sys.executable, "-c", AFFINITY], tmp_path,
                                           {"PATH": os.environ.get("PATH", "")},
                                           timeout=60, keep_bytes=4096))
        assert json.loads(finished.output) == sorted(ALLOWED)
        archive = Archive(tmp_path / "memory")
        archive.write_in_a_process()
        try:
            child = archive._write_process._child
            assert child is not None and child.poll() is None
            assert os.sched_getaffinity(child.pid) == set(ALLOWED)
        finally:
            archive.close()
    finally:
        PLACEMENT.release()


@needs_two_cpus
def test_a_thread_started_while_a_child_was_being_started_is_placed_at_the_next_look(placement):
    cpu = min(ALLOWED)
    placement.place(cpu)
    gate = threading.Event()
    with placement.children():
        late = threading.Thread(target=gate.wait, args=(30,))
        late.start()
    try:
        assert os.sched_getaffinity(late.native_id) == set(ALLOWED)
        quiet = CpuTimes({cpu: (0, 100)}, own=0)
        assert not placement.move_if_busy(quiet, quiet)
        assert os.sched_getaffinity(late.native_id) == {cpu}
    finally:
        gate.set()
        late.join(10)


# -- moving -------------------------------------------------------------------------

def times(own: int, **cpus: tuple[int, int]) -> CpuTimes:
    return CpuTimes({int(name[1:]): value for name, value in cpus.items()}, own)


START = times(0, c0=(0, 0), c1=(0, 0), c2=(0, 0))


def test_other_work_on_the_kernels_cpu_moves_it_to_the_idlest_other():
    after = times(0, c0=(90, 100), c1=(70, 100), c2=(10, 100))
    assert idler_cpu(START, after, 0, frozenset({0, 1, 2})) == 2
    assert idler_cpu(START, after, 0, frozenset({0, 1})) is None   # 0.70 is not idler by 0.25


def test_the_kernels_own_work_does_not_count_as_busy():
    after = times(90, c0=(95, 100), c1=(0, 100))
    assert others_share(START, after, 0) == pytest.approx(0.05)
    assert idler_cpu(START, after, 0, frozenset({0, 1})) is None


def test_a_cpu_others_use_less_than_half_the_time_is_kept():
    after = times(0, c0=(int(BUSY_SHARE * 100), 100), c1=(0, 100))
    assert idler_cpu(START, after, 0, frozenset({0, 1})) is None


def test_a_cpu_gone_from_the_times_is_not_chosen():
    after = times(0, c0=(100, 100))
    assert idler_cpu(START, after, 0, frozenset({0, 1})) is None


@needs_two_cpus
def test_a_process_spinning_on_the_kernels_cpu_is_seen_as_other_work(placement):
    """Real times: a busy loop held to the kernel's CPU makes it busy with others' work."""
    cpu = min(ALLOWED)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {cpu})
        time.sleep(0.2)
        before = read_cpu_times()
        time.sleep(0.6)
        after = read_cpu_times()
    finally:
        spinner.kill()
        spinner.wait(30)
    assert set(before.cpus) >= ALLOWED
    assert others_share(before, after, cpu) > BUSY_SHARE


@needs_two_cpus
def test_the_watch_looks_until_the_threads_are_released(placement, monkeypatch):
    looked = []
    monkeypatch.setattr(placement, "move_if_busy",
                        lambda before, after: looked.append(after.own >= before.own))

    async def watch_a_while():
        watching = asyncio.create_task(placement.watch(every=0.01))
        for _ in range(500):
            if len(looked) >= 3:
                break
            await asyncio.sleep(0.01)
        placement.release()
        await asyncio.wait_for(watching, 10)

    assert placement.place(min(ALLOWED))
    asyncio.run(watch_a_while())
    assert len(looked) >= 3 and all(looked)


# -- serve --------------------------------------------------------------------------

@needs_two_cpus
def test_serve_runs_its_threads_on_one_cpu_and_its_write_process_on_any(home, tmp_path):
    (home / "config.toml").write_text("[memory]\nwrite_process = true\n")
    runtime = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "opencortex", "serve", "--home", str(home), "--backend", "echo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)))
    try:
        port = process.stdout.readline()
        assert port.strip().isdigit(), process.stderr.read()
        secret = json.loads(default_connection_file(home, runtime / "opencortex")
                            .read_text())["secret"]
        client = EPCClient(("127.0.0.1", int(port)))
        try:
            assert client.call_sync("authenticate", [secret], timeout=120) is True
            assert "echo" in client.call_sync("status", ["placed"], timeout=120)
        finally:
            client.close()
        placed = set(affinities(process.pid).values())
        assert len(placed) == 1 and len(next(iter(placed))) == 1, placed
        children = [int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children")
                    .read_text().split()]
        assert children                                # the archive's write process
        assert all(os.sched_getaffinity(pid) == set(ALLOWED) for pid in children)
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
        process.stdout.close()
        process.stderr.close()


@needs_two_cpus
def test_serve_moves_its_threads_off_a_cpu_other_work_keeps_busy(home, tmp_path):
    """A process spinning on the CPU serve's threads are on: within seconds they are
    on another (unless that one is as busy: then there is nowhere better to go)."""
    runtime = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "opencortex", "serve", "--home", str(home), "--backend", "echo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)))
    spinner = None
    try:
        assert process.stdout.readline().strip().isdigit(), process.stderr.read()
        placed: set = set()
        for _ in range(600):                         # until the kernel is built and placed
            placed = set(affinities(process.pid).values())
            if len(placed) == 1 and len(next(iter(placed))) == 1:
                break
            time.sleep(0.05)
        [[cpu]] = placed
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(spinner.pid, {cpu})
        before = read_cpu_times()
        for _ in range(200):                         # 10 s at most
            time.sleep(0.05)
            if set(affinities(process.pid).values()) != {frozenset({cpu})}:
                break
        moved = set(affinities(process.pid).values())
        if moved == {frozenset({cpu})}:                # stayed: fine only with nowhere idler
            after = read_cpu_times()
            idlest = min(busy_share(before, after, other) for other in ALLOWED - {cpu})
            assert idlest + MARGIN >= busy_share(before, after, cpu), "an idler CPU was left"
            pytest.skip(f"every other CPU was busy too (the idlest {idlest:.0%})")
        [[now]] = moved
        assert now != cpu
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait(30)
        process.terminate()
        assert process.wait(timeout=60) == 0
        process.stdout.close()
        process.stderr.close()
