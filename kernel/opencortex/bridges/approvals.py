"""Approvals on a bridge: a person decides from their phone, and only that person.

`BridgeApprover` shows an `ApprovalRequest` (kernel facts only) through the
platform with Approve/Deny controls and waits.  A decision reaches `decide`
from a button, a reaction or a reply ("approve" / "deny"), and counts only when:

- it names an approval that is still open (a decision is single-use; expiry,
  after the request's timeout, is a denial);
- it carries the digest of the exact action shown (an answer can never approve
  a different action);
- it comes from the sender whose message led to the request, or from one of
  the bridge's configured `approvers`.

Anything else is refused with a short answer and one log line (ids only, no
content).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from opencortex.approvals import ApprovalDecision, ApprovalRequest, Approver

log = logging.getLogger(__name__)

DIGEST_CHARS = 16   # of the action digest carried by a button (Telegram: 64 bytes of data)
ANSWERS = {"approve": True, "approved": True, "yes": True, "y": True,
           "deny": False, "denied": False, "no": False, "n": False}


class ApprovalSurface(Protocol):
    """What a platform offers for approvals (see `opencortex.bridges.contract.Platform`)."""

    async def show_approval(self, chat_id: str, text: str, approval_id: str,
                            digest: str, reply_to: str | None = None) -> Any: ...

    async def settle_approval(self, chat_id: str, handle: Any, outcome: str) -> None: ...


@dataclass
class _Pending:
    request: ApprovalRequest
    chat_id: str
    future: asyncio.Future[bool]
    handle: Any = None
    deciders: frozenset[str] = field(default_factory=frozenset)


def short_digest(request: ApprovalRequest) -> str:
    return request.digest[:DIGEST_CHARS]


def parse_answer(text: str) -> bool | None:
    """True/False for a reply that approves or denies ("approve", "deny", …), else None."""
    return ANSWERS.get(text.strip().lower().rstrip(".!"))


class BridgeApprover(Approver):
    """Asks on a bridge and settles decisions that are bound, single-use and the asker's."""

    def __init__(self, surface: ApprovalSurface, approvers: list[str],
                 timeout: float | None = None):
        self.surface = surface
        self.approvers = frozenset(approvers)
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        chat_id = request.thread.chat_id
        future = asyncio.get_running_loop().create_future()
        pending = _Pending(request, chat_id, future,
                           deciders=self.approvers | {request.requested_by} - {""})
        self._pending[request.id] = pending
        timeout = self.timeout or request.timeout
        try:
            pending.handle = await self.surface.show_approval(
                chat_id, request.as_text(), request.id, short_digest(request),
                reply_to=request.asked_in or None)
            approved = await asyncio.wait_for(future, timeout)
            decision = ApprovalDecision("approved" if approved else "denied")
        except asyncio.TimeoutError:
            decision = ApprovalDecision("timed-out")
        except Exception as error:   # the platform could not show it: nothing runs
            log.warning("approval %s could not be shown: %s", request.id, type(error).__name__)
            decision = ApprovalDecision("unavailable")
        finally:
            self._pending.pop(request.id, None)
        await self._settle_shown(pending, decision)
        return decision

    async def _settle_shown(self, pending: _Pending, decision: ApprovalDecision) -> None:
        if pending.handle is None:
            return
        try:
            await self.surface.settle_approval(pending.chat_id, pending.handle,
                                               f"Approval {decision.how}.")
        except Exception as error:
            log.info("approval outcome not shown: %s", type(error).__name__)

    def decide(self, approval_id: str, digest: str, decider: str, approve: bool) -> str:
        """Settle APPROVAL_ID for DECIDER; the short answer to show them."""
        pending = self._pending.get(approval_id)
        if pending is None or pending.future.done():
            return "This approval is no longer open."
        if not hmac.compare_digest(digest.encode(), short_digest(pending.request).encode()):
            log.warning("approval %s: a decision for another action was refused", approval_id)
            return "This answer does not match the action shown; nothing was done."
        if decider not in pending.deciders:
            log.warning("approval %s: sender %s may not decide it", approval_id, decider)
            return "Only the person who asked can decide this."
        pending.future.set_result(approve)
        return "Approved." if approve else "Denied."

    def open_in(self, chat_id: str, decider: str) -> str | None:
        """The newest open approval in CHAT_ID that DECIDER may decide (for text replies)."""
        for approval_id, pending in reversed(list(self._pending.items())):
            if pending.chat_id == chat_id and decider in pending.deciders \
                    and not pending.future.done():
                return approval_id
        return None

    def digest_of(self, approval_id: str) -> str:
        pending = self._pending.get(approval_id)
        return short_digest(pending.request) if pending else ""
