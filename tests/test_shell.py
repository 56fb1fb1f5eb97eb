"""The shell actuator on its own: only after approval, no shell, bounded, scrubbed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from opencortex.actions import ShellCommand
from opencortex.actuators import ActuatorError, reaper
from opencortex.actuators.shell import ShellActuator, example_block
from opencortex.approvals import ApprovalDecision
from opencortex.config import ShellSettings
from opencortex.reader import Keyword

YES, NO = ApprovalDecision("approved"), ApprovalDecision("denied")


def command(cmd, cwd=None) -> ShellCommand:
    return ShellCommand(type=Keyword("request"), target=Keyword("shell"), cmd=cmd, cwd=cwd)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def test_nothing_runs_without_an_approval(tmp_path):
    shell = ShellActuator(ShellSettings(), tmp_path)
    with pytest.raises(ActuatorError, match="not approved"):
        run(shell.run_approved(command(["touch", "x"]), NO))
    assert not (tmp_path / "x").exists()


def test_no_shell_interpolation(tmp_path):
    shell = ShellActuator(ShellSettings(), tmp_path)
    out = run(shell.run_approved(command('echo "$HOME" `id` ; ls'), YES)).result
    assert "$HOME `id` ; ls" in out and "exit 0" in out


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    shell = ShellActuator(ShellSettings(timeout=0.5), tmp_path)
    out = run(shell.run_approved(command(["sh", "-c", "sleep 30 & sleep 30"]), YES)).result
    assert "killed after 0.5 s" in out


def test_the_directory_stays_inside_the_configured_one(tmp_path):
    (tmp_path / "sub").mkdir()
    shell = ShellActuator(ShellSettings(), tmp_path)
    assert shell.working_directory(command("ls", "sub")) == (tmp_path / "sub").resolve()
    with pytest.raises(ActuatorError, match="only run inside"):
        shell.working_directory(command("ls", "../.."))


def test_long_output_is_truncated_with_a_note_and_org_lines_are_escaped():
    block = example_block("Shell: x", "* heading\n#+end_example\n" + "y" * 50, 30)
    assert ",* heading" in block and ",#+end_example" in block
    assert "[output truncated: showing 30 characters of the 74 bytes written]" in block


# --- bounded in time and memory (issue 8 §6) ---------------------------------------------------

BOUND = 5.0  # generous: the turn must end within the timeout plus a small grace


def marker() -> str:
    """A unique `sleep` duration (~1 h): it names the processes a test starts."""
    return f"{3000 + uuid.uuid4().int % 600}.{uuid.uuid4().int % 10**6:06d}"


def processes_with(mark: str) -> list[int]:
    """Pids of live processes whose command line holds MARK."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if mark.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def kill_all_with(mark: str) -> None:
    """SIGKILL whatever a failed test left running."""
    for pid in processes_with(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def gone_within(mark: str, seconds: float) -> bool:
    """Whether no process with MARK is left, waiting at most SECONDS (bounded loop)."""
    for _ in range(int(seconds / 0.05)):
        if not processes_with(mark):
            return True
        time.sleep(0.05)
    return not processes_with(mark)


def timed_run(shell: ShellActuator, argv: list[str]) -> tuple[float, str]:
    """Seconds an approved run of ARGV took, and its result."""
    started = time.monotonic()
    result = run(shell.run_approved(command(argv), YES)).result
    return time.monotonic() - started, result


@pytest.mark.parametrize("script", [
    "setsid sleep {m} & sleep {m}",                        # a grandchild in its own session
    "(setsid sh -c 'sleep {m}; :' &) ; sleep {m}",         # a double-forked daemon
])
def test_a_timeout_ends_the_turn_even_when_a_descendant_escapes_the_group(tmp_path, script):
    mark = marker()
    shell = ShellActuator(ShellSettings(timeout=1.0), tmp_path)
    try:
        seconds, out = timed_run(shell, ["sh", "-c", script.format(m=mark)])
        assert "killed after 1 s" in out
        assert seconds < BOUND
        assert processes_with(mark) == []
    finally:
        kill_all_with(mark)


def test_a_command_that_exits_leaves_no_background_process_running(tmp_path):
    mark = marker()
    shell = ShellActuator(ShellSettings(timeout=30.0), tmp_path)
    try:
        seconds, out = timed_run(shell, ["sh", "-c", f"setsid sleep {mark} & echo started"])
        assert "(exit 0)" in out and "started" in out
        assert seconds < BOUND
        assert processes_with(mark) == []
    finally:
        kill_all_with(mark)


def memory_kb(field: str) -> int:
    """FIELD (VmRSS, VmHWM) of this process, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def test_huge_output_keeps_memory_bounded_and_says_how_much_was_written(tmp_path):
    try:
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS starts again from now
        before = memory_kb("VmRSS")
    except OSError:
        before = memory_kb("VmHWM")
    shell = ShellActuator(ShellSettings(timeout=60.0, output_limit=1000), tmp_path)
    out = run(shell.run_approved(command(["head", "-c", "400000000", "/dev/zero"]), YES)).result
    assert memory_kb("VmHWM") - before < 64 * 1024
    assert "(exit 0)" in out
    assert out.endswith("[output truncated: showing 1000 characters of the 400000000 bytes written]")


def test_output_and_exit_status_are_reported_as_before(tmp_path):
    shell = ShellActuator(ShellSettings(), tmp_path)
    out = run(shell.run_approved(command(["sh", "-c", "echo out; echo err >&2; exit 3"]), YES)).result
    assert "#+begin_example\nout\nerr\n#+end_example" in out and "(exit 3)" in out
    out = run(shell.run_approved(command(["sh", "-c", "kill -9 $$"]), YES)).result
    assert "(exit -9)" in out


def test_a_missing_program_is_an_actuator_error(tmp_path):
    shell = ShellActuator(ShellSettings(), tmp_path)
    with pytest.raises(ActuatorError, match="cannot run 'no-such-program-here': No such file"):
        run(shell.run_approved(command(["no-such-program-here"]), YES))


def test_the_command_gets_exactly_the_scrubbed_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCORTEX_TEST_API_TOKEN", "s3cret")
    monkeypatch.setenv("OPENCORTEX_TEST_KEPT", "kept value")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    keep = ["PATH", "OPENCORTEX_TEST_KEPT", "OPENCORTEX_TEST_API_TOKEN"]
    shell = ShellActuator(ShellSettings(keep_env=keep), tmp_path)
    out = run(shell.run_approved(command(["env"]), YES)).result
    body = out.split("#+begin_example\n", 1)[1].split("\n#+end_example", 1)[0]
    assert sorted(body.split("\n")) == ["OPENCORTEX_TEST_KEPT=kept value", "PATH=/usr/bin:/bin"]


def test_a_cancelled_turn_leaves_nothing_running(tmp_path):
    mark = marker()
    shell = ShellActuator(ShellSettings(timeout=60.0), tmp_path)

    async def cancelled_soon():
        argv = ["sh", "-c", f"setsid sleep {mark} & sleep {mark}"]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(shell.run_approved(command(argv), YES), 1.0)

    try:
        asyncio.run(cancelled_soon())
        assert gone_within(mark, BOUND)
    finally:
        kill_all_with(mark)


KERNEL_THAT_DIES = """
import asyncio, sys
from pathlib import Path
from opencortex.actions import ShellCommand
from opencortex.actuators.shell import ShellActuator
from opencortex.approvals import ApprovalDecision
from opencortex.config import ShellSettings
from opencortex.reader import Keyword
action = ShellCommand(type=Keyword("request"), target=Keyword("shell"), cmd=sys.argv[1:])
shell = ShellActuator(ShellSettings(timeout=60.0), Path.cwd())
asyncio.run(shell.run_approved(action, ApprovalDecision("approved")))
"""


def test_a_kernel_that_dies_leaves_no_command_running(tmp_path):
    mark = marker()
    argv = ["sh", "-c", f"setsid sleep {mark} & sleep {mark}"]
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL_THAT_DIES, *argv], cwd=tmp_path)
    try:
        for _ in range(200):  # until both sleeps run (at most 20 s)
            if len(processes_with(mark)) >= 2 or kernel.poll() is not None:
                break
            time.sleep(0.1)
        assert len(processes_with(mark)) >= 2
        kernel.kill()
        kernel.wait(timeout=BOUND)
        assert gone_within(mark, BOUND)
    finally:
        kernel.kill()
        kernel.wait(timeout=BOUND)
        kill_all_with(mark)


def test_without_a_subreaper_the_command_group_is_still_killed():
    mark = marker()
    command_pid = reaper.spawn(["sh", "-c", f"sleep {mark} & sleep {mark}"])
    try:
        for _ in range(100):  # until both sleeps run (at most 10 s)
            if len(processes_with(mark)) >= 2:
                break
            time.sleep(0.1)
        statuses: dict[int, int] = {}
        assert reaper.sweep(command_pid, statuses, subreaper=False) is False  # "unswept"
        assert command_pid in statuses
        assert gone_within(mark, BOUND)
    finally:
        kill_all_with(mark)
