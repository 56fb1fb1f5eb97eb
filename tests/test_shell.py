"""The shell actuator on its own: only after approval, no shell, bounded, scrubbed."""

from __future__ import annotations

import asyncio

import pytest

from opencortex.actions import ShellCommand
from opencortex.actuators import ActuatorError
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
    assert "[output truncated: showing 30 of" in block
