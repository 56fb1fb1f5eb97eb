"""Human approval ("yield") for risky actions: nothing runs without an explicit yes.

The kernel describes what would run in an `ApprovalRequest` and hands it to the
`Approver` of the channel the message came from.  An approver answers with an
`ApprovalDecision`; no answer within the timeout is a denial.  Channels with no
approver cannot approve anything.
"""

from __future__ import annotations

import abc
import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Literal

from opencortex.events import Thread

How = Literal["approved", "denied", "timed-out", "unavailable"]


@dataclass(frozen=True)
class ApprovalRequest:
    """Exactly what would run, where, and why."""

    thread: Thread
    argv: tuple[str, ...]
    cwd: str
    reason: str
    timeout: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def command(self) -> str:
        import shlex
        return shlex.join(self.argv)


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
