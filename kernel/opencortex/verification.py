"""Judging a model reply: read it as data, type it, let every skill verify it.

Order, deny by default at every step:
1. read exactly one plist (`opencortex.reader`), never evaluating anything;
2. type it as an action (`opencortex.actions`): unknown or malformed is rejected,
   and so is any key by which a model would approve its own action;
3. every loaded skill's deterministic phase, highest priority first: each may
   pass it, rewrite it (the rewrite is typed again), reject it, or ask for a
   person's approval; a verifier that fails rejects;
4. a shell command is never accepted outright: it needs approval.

Judging costs time linear in the reply's size (the reader caps bytes, depth and
elements; error lists are cut short), and what a verdict says stays small
whatever the reply: at most `MAX_ERRORS` errors of at most `REASON_LIMIT`
characters, `ERRORS_BUDGET` characters in all, each quoting only a short
excerpt of the reply.  The errors go back to the model on a re-ask.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from opencortex.actions import Action, ActionRejected, ShellCommand, validate_action
from opencortex.excerpt import clip, excerpt
from opencortex.reader import Keyword, ReadError, read_reply
from opencortex.skills import NeedsApproval, Rejection, Skill, SkillContext
from opencortex.tools import ToolRegistry

log = logging.getLogger(__name__)

Status = Literal["accepted", "rejected", "needs-approval", "denied"]  # denied: by policy

MAX_ERRORS = 10        # errors a verdict carries; the rest are counted
REASON_LIMIT = 1000    # characters of one error or approval reason
ERRORS_BUDGET = 4000   # characters of all errors together
FORM_EXCERPT = 120     # characters of the rejected form quoted in an error
_COUNT_LINE = re.compile(r"and \d+ more[a-z ]{0,40}")  # "and 12 more problems like these"


@dataclass
class Verdict:
    """What the kernel decided about one reply."""

    status: Status
    action: Action | None = None
    form: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    ignored: str = ""
    approval_reason: str | None = None

    def __post_init__(self) -> None:
        self.errors = bounded(self.errors)
        if self.approval_reason is not None:
            self.approval_reason = clip(self.approval_reason, REASON_LIMIT)

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def as_json(self) -> dict[str, Any]:
        action = self.action.to_plist() if self.action is not None else self.form
        return {"verdict": self.status, "action": jsonable(action), "errors": list(self.errors),
                "ignored": self.ignored or None, "approval_reason": self.approval_reason}


def jsonable(value: Any) -> Any:
    """Reader data as JSON-friendly data (keywords as ':name' strings)."""
    if isinstance(value, Keyword):
        return f":{value}"
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def bounded(errors: list[str]) -> list[str]:
    """ERRORS cut to at most MAX_ERRORS of at most REASON_LIMIT characters and
    ERRORS_BUDGET characters in all, then one line counting the rest (kept as
    it is when ERRORS already ends with such a count)."""
    kept: list[str] = []
    used = 0
    for error in errors:
        error = clip(error, REASON_LIMIT)
        if len(kept) == MAX_ERRORS or used + len(error) > ERRORS_BUDGET:
            break
        kept.append(error)
        used += len(error)
    rest = len(errors) - len(kept)
    if rest == 1 and _COUNT_LINE.fullmatch(errors[-1]):
        kept.append(errors[-1])
    elif rest:
        kept.append(f"and {rest} more")
    return kept


def _invalid(form: Mapping[str, Any], reasons: list[str]) -> list[str]:
    """The errors for a FORM that is not a valid action: the first quotes it."""
    shown = excerpt(form, FORM_EXCERPT)
    return [f"invalid action {shown}: {reasons[0]}", *reasons[1:]] if reasons \
        else [f"invalid action {shown}"]


def _apply_skill(skill: Skill, action: Action, ctx: SkillContext,
                 tools: ToolRegistry | None) -> tuple[Action, Rejection | NeedsApproval | None]:
    """Run one verifier; return the (maybe rewritten) action and any decision."""
    try:
        outcome = skill.deterministic(action.to_plist(), ctx)
    except Exception as error:  # a broken verifier denies; it never lets an action through
        log.warning("verifier of skill %s failed: %s", skill.name, type(error).__name__)
        return action, Rejection(f"the verifier of skill {skill.name} failed "
                                 f"({type(error).__name__}), so the action is denied")
    if outcome is None:
        return action, None
    if isinstance(outcome, (Rejection, NeedsApproval)):
        return action, outcome
    if isinstance(outcome, Mapping):
        try:
            return validate_action(dict(outcome), tools), None
        except ActionRejected as error:
            return action, Rejection(f"skill {skill.name} rewrote the action into one that is "
                                     f"not valid: {error}")
    return action, Rejection(f"the verifier of skill {skill.name} returned a "
                             f"{type(outcome).__name__}; expected nil, a plist, reject or "
                             "needs-approval")


def judge_form(form: dict[str, Any], skills: Sequence[Skill], ctx: SkillContext,
               tools: ToolRegistry | None = None) -> Verdict:
    """Steps 2–4 for an already-read plist FORM."""
    try:
        action = validate_action(form, tools)
    except ActionRejected as error:
        return Verdict("rejected", form=form, errors=_invalid(form, error.reasons))
    approval: str | None = None
    for skill in skills:
        if skill.deterministic is None:
            continue
        action, decision = _apply_skill(skill, action, ctx, tools)
        if isinstance(decision, Rejection):
            return Verdict("rejected", action=action, form=form, errors=[decision.reason])
        if isinstance(decision, NeedsApproval):
            approval = approval or decision.reason
    if isinstance(action, ShellCommand):
        approval = approval or action.reason or "shell commands always need a person's approval"
    if approval is not None:
        return Verdict("needs-approval", action=action, form=form, approval_reason=approval)
    return Verdict("accepted", action=action, form=form)


def judge(text: str, skills: Sequence[Skill], ctx: SkillContext,
          tools: ToolRegistry | None = None, *, max_bytes: int = 1 << 20,
          max_depth: int = 64, max_elements: int = 10_000) -> Verdict:
    """Read model TEXT and judge it (steps 1–4)."""
    try:
        reading = read_reply(text, max_bytes=max_bytes, max_depth=max_depth,
                             max_elements=max_elements)
    except ReadError as error:
        return Verdict("rejected", errors=[f"the reply could not be read as one plist: {error}"])
    verdict = judge_form(reading.form, skills, ctx, tools)
    verdict.ignored = reading.ignored
    return verdict
