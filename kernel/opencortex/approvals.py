"""Human approval ("yield") for risky actions: nothing runs without an explicit yes.

The kernel describes what would happen in an `ApprovalRequest` built only from
kernel facts: what would run (the argument vector, the directory, the names of
the environment variables passed) or where a message would go and what it
says, which skill asked, in which conversation.  The model's own words (a
shell command's `:reason`) appear only as `model_note`: one line, capped,
control characters made visible (`opencortex.untrusted.model_note`); every
frontend shows it as a quoted field marked as the model's, never as the
kernel's explanation.

The request is handed to the `Approver` of the channel the message came from;
it answers with an `ApprovalDecision`, and no answer within the timeout is a
denial.  Channels with no approver cannot approve anything.  `digest` binds a
decision to the exact action: a frontend that lets a person answer later (a
bridge button) checks it, so an answer can never approve a different action.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from opencortex.events import Thread
from opencortex.untrusted import visible

How = Literal["approved", "denied", "timed-out", "unavailable"]

SHELL = "shell"
TEXT_PREVIEW = 2000  # characters of a cross-post's text shown in the request


def action_digest(printed_action: str) -> str:
    """A short hash of the exact action (its printed plist)."""
    return hashlib.sha256(printed_action.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class ApprovalRequest:
    """Exactly what would happen, where, and who asked: kernel facts only."""

    thread: Thread
    action_class: str                 # "shell", "cross-post", "tool", or a target such as "emacs"
    title: str                        # kernel words: "Run a command", …
    timeout: float
    skill: str = ""
    requested_by: str = ""            # the sender whose message led to it (bridges: who may decide)
    asked_in: str = ""                # that message's platform id (bridges: asked as its answer)
    argv: tuple[str, ...] = ()        # shell: the argument vector
    cwd: str = ""                     # shell: where it runs
    env: tuple[str, ...] = ()         # shell: names of the variables passed
    target: str = ""                  # a message: the conversation it would go to
    text: str = ""                    # a message: what it would say (made visible, capped)
    action: str = ""                  # any other action: its printed plist (made visible)
    tool: str = ""                    # a tool call: the tool's name
    arguments: str = ""               # a tool call: its checked arguments, printed (visible)
    preview: str = ""                 # a tool call: what it would change (a diff), by the tool
    model_note: str = ""              # the model's words, one line, capped, visible
    digest: str = ""                  # action_digest of the exact action
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        for name in ("text", "action", "arguments", "preview"):
            value = getattr(self, name)
            if len(value) > TEXT_PREVIEW:
                value = value[:TEXT_PREVIEW] + f"\n[… {len(value) - TEXT_PREVIEW} more characters]"
            object.__setattr__(self, name, visible(value))

    @property
    def command(self) -> str:
        """The shell command as one line a person can read (empty for other classes)."""
        return visible(shlex.join(self.argv)) if self.argv else ""

    def facts(self) -> dict[str, Any]:
        """The request for a frontend (EPC plist keys); only non-empty facts."""
        shown: dict[str, Any] = {
            "title": self.title, "action-class": self.action_class, "skill": self.skill,
            "thread": visible(str(self.thread)), "timeout": self.timeout,
            "digest": self.digest, "model-note": self.model_note}
        if self.argv:
            shown.update({"command": self.command, "argv": [visible(a) for a in self.argv],
                          "cwd": visible(self.cwd), "env": list(self.env)})
        for key in ("target", "text", "action", "tool", "arguments", "preview"):
            if getattr(self, key):
                shown[key] = getattr(self, key)
        return shown

    def as_text(self) -> str:
        """The request as plain lines, for a terminal or a chat bridge."""
        lines = [f"Approval needed: {self.title}"]
        if self.argv:
            lines += [f"  command:   {self.command}", f"  directory: {visible(self.cwd)}",
                      f"  environment: {', '.join(self.env) or '(none)'}"]
        if self.target:
            lines.append(f"  to:        {visible(self.target)}")
        if self.text:
            lines += ["  text:", *[f"  | {line}" for line in self.text.split("\n")]]
        if self.action:
            lines.append(f"  action:    {self.action}")
        if self.tool:
            lines += [f"  tool:      {visible(self.tool)}", f"  arguments: {self.arguments or '()'}"]
        if self.preview:
            lines += ["  changes:", *[f"  | {line}" for line in self.preview.split("\n")]]
        lines.append(f"  asked by skill {self.skill or '?'} in {visible(str(self.thread))}")
        if self.model_note:
            lines.append(f"  the model says (unverified): “{self.model_note}”")
        return "\n".join(lines)


@dataclass(frozen=True)
class ApprovalDecision:
    how: How

    @property
    def approved(self) -> bool:
        return self.how == "approved"


class Approver(abc.ABC):
    """Asks a person; implemented per frontend (Emacs first)."""

    @abc.abstractmethod
    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        """Show REQUEST to the person and wait for their answer (bounded by its timeout)."""


class ApprovalBook:
    """Approvals waiting for an answer, by id."""

    def __init__(self) -> None:
        self._pending: dict[str, asyncio.Future[bool]] = {}

    def pending(self) -> list[str]:
        return list(self._pending)

    def answer(self, approval_id: str, approved: bool) -> bool:
        """Record a person's answer; False when the id is unknown or already settled."""
        future = self._pending.get(approval_id)
        if future is None or future.done():
            return False
        future.set_result(bool(approved))
        return True

    def open(self, request: ApprovalRequest) -> None:
        """Expect an answer to REQUEST (before showing it, so no answer can come too early)."""
        self._pending.setdefault(request.id, asyncio.get_running_loop().create_future())

    def close(self, approval_id: str) -> None:
        self._pending.pop(approval_id, None)

    async def wait(self, request: ApprovalRequest) -> ApprovalDecision:
        """Wait for the answer to REQUEST; silence until its timeout is a denial."""
        self.open(request)
        future = self._pending[request.id]
        try:
            approved = await asyncio.wait_for(future, request.timeout)
        except asyncio.TimeoutError:
            return ApprovalDecision("timed-out")
        finally:
            self._pending.pop(request.id, None)
        return ApprovalDecision("approved" if approved else "denied")
