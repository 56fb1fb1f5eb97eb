"""The shell actuator: runs a command a person approved, and nothing else.

No shell: the command is an argument vector (a string command is split with
shlex, never interpolated).  It runs in a configured directory, with a timeout,
with stdin closed and a scrubbed environment: only the variables named in
`shell.keep_env` pass, and never one that looks like a key or secret.
Output comes back as an org example block, truncated with a note when long.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
from pathlib import Path

from opencortex.actions import Action, ShellCommand
from opencortex.actuators.base import Actuator, ActuatorError, Outcome
from opencortex.approvals import ApprovalDecision
from opencortex.config import ShellSettings
from opencortex.events import Event

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


def argv_of(action: ShellCommand) -> list[str]:
    """The argument vector ACTION asks for; ActuatorError if it is empty or unparsable."""
    if isinstance(action.cmd, str):
        try:
            argv = shlex.split(action.cmd)
        except ValueError as error:
            raise ActuatorError(f"the command cannot be split into arguments: {error}") from None
    else:
        argv = list(action.cmd)
    if not argv or not argv[0]:
        raise ActuatorError("the command is empty")
    return argv


def scrubbed_environment(keep: list[str]) -> dict[str, str]:
    return {name: os.environ[name] for name in keep
            if name in os.environ and not SECRET_NAME.search(name)}


def example_block(title: str, output: str, limit: int) -> str:
    """OUTPUT as an org example block under a TITLE heading, truncated past LIMIT characters."""
    note = ""
    if len(output) > limit:
        note = f"\n[output truncated: showing {limit} of {len(output)} characters]"
        output = output[:limit]
    lines = [("," + line) if line.lstrip().startswith(("*", "#+", ",*", ",#+")) else line
             for line in output.rstrip("\n").split("\n")]
    return f"* {title}\n#+begin_example\n" + "\n".join(lines) + "\n#+end_example" + note


class ShellActuator(Actuator):
    targets = ("shell",)

    def __init__(self, settings: ShellSettings, home: Path):
        self.settings = settings
        self.cwd = settings.cwd or home

    def working_directory(self, action: ShellCommand) -> Path:
        """Where ACTION runs: the configured directory, or a directory inside it."""
        base = Path(self.cwd).resolve()
        if not action.cwd:
            return base
        chosen = (base / action.cwd).resolve()
        if chosen != base and base not in chosen.parents:
            raise ActuatorError(f"the command may only run inside {base}, not in {chosen}")
        return chosen

    async def carry_out(self, action: Action, event: Event) -> Outcome:
        raise ActuatorError("shell commands run only after a person approves them")

    async def run_approved(self, action: ShellCommand, decision: ApprovalDecision) -> Outcome:
        """Run ACTION, which DECISION must approve."""
        if not decision.approved:
            raise ActuatorError("this command was not approved")
        argv = argv_of(action)
        cwd = self.working_directory(action)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=scrubbed_environment(self.settings.keep_env),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            raise ActuatorError(f"cannot run {argv[0]!r}: {error.strerror}") from None
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.settings.timeout)
            status = f"exit {process.returncode}"
        except asyncio.TimeoutError:
            # The whole process group: a child still holding the output pipe would
            # otherwise keep communicate() waiting after the command itself was killed.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            output, _ = await process.communicate()
            status = f"killed after {self.settings.timeout:g} s"
        text = output.decode("utf-8", errors="replace")
        title = f"Shell: {shlex.join(argv)} ({status})"
        return Outcome(result=example_block(title, text, self.settings.output_limit))
