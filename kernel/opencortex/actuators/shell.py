"""The shell actuator: runs a command a person approved, and nothing else.

No shell: the command is an argument vector (a string command is split with
shlex, never interpolated).  It runs in a configured directory, with a timeout,
with stdin closed and a scrubbed environment: only the variables named in
`shell.keep_env` pass, and never one that looks like a key or secret.
It runs under a reaper (see `bounded` and `reaper`): the timeout ends the turn
even when the command leaves daemons behind, nothing it started outlives it,
and only the first part of its output is ever held in memory.
Output comes back as an org example block, truncated with a note when long.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from opencortex.actions import Action, ShellCommand
from opencortex.actuators.base import Actuator, ActuatorError, Outcome
from opencortex.actuators.bounded import Finished, run_bounded
from opencortex.approvals import ApprovalDecision
from opencortex.config import ShellSettings
from opencortex.environ_scrub import SECRET_NAME
from opencortex.events import Event

# Kept bytes per shown character: UTF-8 needs at most 4, so the kept bytes always
# decode to more than output_limit characters when the output was longer.
BYTES_PER_CHARACTER = 4


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


def example_block(title: str, output: str, limit: int, total_bytes: int | None = None) -> str:
    """OUTPUT as an org example block under a TITLE heading, truncated past LIMIT characters.

    TOTAL_BYTES is how much the command wrote in all (OUTPUT may be only its start).
    """
    note = ""
    if len(output) > limit:
        total = len(output.encode()) if total_bytes is None else total_bytes
        note = f"\n[output truncated: showing {limit} characters of the {total} bytes written]"
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

    def status_of(self, finished: Finished) -> str:
        """How the run ended, for the block's title: an exit status or the timeout."""
        if finished.timed_out:
            return f"killed after {self.settings.timeout:g} s"
        if finished.returncode is None:
            return "ended without a status"
        return f"exit {finished.returncode}"

    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        raise ActuatorError("shell commands run only after a person approves them")

    async def run_approved(self, action: ShellCommand, decision: ApprovalDecision) -> Outcome:
        """Run ACTION, which DECISION must approve."""
        if not decision.approved:
            raise ActuatorError("this command was not approved")
        argv = argv_of(action)
        cwd = self.working_directory(action)
        try:
            finished = await run_bounded(
                argv, cwd, scrubbed_environment(self.settings.keep_env), self.settings.timeout,
                keep_bytes=BYTES_PER_CHARACTER * self.settings.output_limit + BYTES_PER_CHARACTER)
        except OSError as error:
            raise ActuatorError(f"cannot run {argv[0]!r}: {error.strerror}") from None
        text = finished.output.decode("utf-8", errors="replace")
        title = f"Shell: {shlex.join(argv)} ({self.status_of(finished)})"
        return Outcome(result=example_block(title, text, self.settings.output_limit,
                                            finished.total_bytes))
