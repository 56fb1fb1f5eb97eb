"""After the verdict: carry the action out or ask a person first, tell the person, archive.

The kernel hands every judged reply here (`Actuation.finish`).  An accepted
action goes to its actuator; one that needs approval is described by kernel
facts (`opencortex.approvals.ApprovalRequest`) and shown to the approver of
the channel it came from — nothing is done without a yes, and a channel that
cannot ask does nothing.  Whatever ends a turn is archived as one turn (the
person's message and everything said back) and said only once that write is
durable (the `durable` hook of `Conversations.record_turn`), so memory never
holds half a turn and never misses what the person saw; what then does not
reach them is marked so after its turn (`opencortex.conversation.delivery`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from opencortex.actions import Action, Log, Response, ShellCommand, ToolCall, reply_action
from opencortex.actuators import ActuatorError, ActuatorRegistry, MessageActuator
from opencortex.actuators.base import address_of
from opencortex.actuators.shell import ShellActuator, argv_of, scrubbed_environment
from opencortex.approvals import (SHELL, ApprovalDecision, ApprovalRequest, Approver,
                                  action_digest)
from opencortex.config import Config
from opencortex.conversation.conversations import Conversations, WhenDurable
from opencortex.conversation.delivery import DELIVERY, FAILED
from opencortex.events import Event
from opencortex.llm.routing import archetype_for
from opencortex.memory import MessageRecord, NewMessage
from opencortex.memory.rows import PLATFORM_ID, SENDER_NAME  # noqa: F401 (PLATFORM_ID: bridges)
from opencortex.pinning import CROSS_POST, destination, is_own
from opencortex.printer import print_plist
from opencortex.telemetry import Telemetry
from opencortex.turn import TurnFailed, TurnResult
from opencortex.untrusted import model_note
from opencortex.verification import Verdict

log = logging.getLogger(__name__)

STEP = "STEP"                 # archive property: the number of a tool-loop step in its turn
STEP_OUTCOME = "STEP_OUTCOME"  # archive property: done, failed, denied, not approved


class Actuation:
    """Carries out verdicts for the kernel; owns no state of its own but the approvers."""

    def __init__(self, *, config: Config, actuators: ActuatorRegistry,
                 conversations: Conversations, approvers: dict[str, Approver],
                 telemetry: Telemetry | None = None):
        self.config = config
        self.actuators = actuators
        self.conversations = conversations
        self.approvers = approvers
        self.telemetry = telemetry or Telemetry()

    async def finish(self, event: Event, verdict: Verdict, result: TurnResult) -> None:
        """End the turn VERDICT decided.  Once the person may see effects, the turn
        completes even if its task is cancelled."""
        if verdict.status in ("rejected", "denied"):
            result.status = "rejected"
            await self.give_up(event, verdict, result)
            return
        assert verdict.action is not None
        result.action = verdict.action.to_plist()
        if verdict.status == "needs-approval":
            await asyncio.shield(self.hold_for_approval(event, verdict, result))
            return
        await asyncio.shield(self.act(event, verdict.action, result))

    # -- accepted -------------------------------------------------------------

    async def act(self, event: Event, action: Action, result: TurnResult) -> None:
        if isinstance(action, Log):
            result.status = "done"
            result.ids = await self.archive(event, result, action.text, turn_type="thought")
            return
        if isinstance(action, Response):
            action = reply_action(event.channel, event.chat_id, action.text,
                                  self.config.chat.buffer)
        target = str(action.to_plist().get("target"))
        if action.reply_text is not None:
            await self.reply(event, action, target, result)
            return
        try:
            outcome = await self.actuators.for_target(target).carry_out(action, event)
        except ActuatorError as error:
            result.errors.append(str(error))
            raise TurnFailed(str(error)) from error
        result.status = "done"
        result.text = outcome.shown if outcome.shown is not None else action.reply_text
        result.ids = await self.archive(event, result, result.text or "")

    async def reply(self, event: Event, action: Action, target: str,
                    result: TurnResult) -> None:
        """Say ACTION's verified words, once the turn that holds them is durable: a
        person is never told what a crash could take back.  A reply no actuator can
        say is kept, marked undelivered; one the platform then refuses is kept as
        written, followed by a mark that it was not delivered (`conversation.delivery`),
        and the turn fails.  Either way a person asking elsewhere than where the reply
        went (another buffer, another platform) is told."""
        text = action.reply_text or ""
        result.text = text
        try:
            actuator = self.actuators.for_target(target)
        except ActuatorError as error:
            result.errors.append(str(error))
            result.status = "failed"
            result.ids = await self.archive(event, result, text, extra={DELIVERY: FAILED})
            await self._not_delivered(event, action, target, error, result)
            return
        actuator.saying(event)

        async def say(records: list[MessageRecord]) -> None:
            said = [record.id for record in records if record.role == "assistant"]
            try:                        # the reply's id names it (said again after a crash)
                outcome = await actuator.carry_out(action, event,
                                                   key=said[-1] if said else None)
            except ActuatorError as error:
                result.errors.append(str(error))
                result.status = "failed"
                log.warning("a durable reply could not be delivered on %s", event.channel)
                if said:
                    await self.conversations.mark_undelivered(event.thread, said[-1],
                                                              str(error))
                await self._not_delivered(event, action, target, error, result)
                return
            result.status = "done"
            if outcome.shown is not None:
                result.text = outcome.shown
        result.ids = await self.archive(event, result, text, durable=say)

    async def _not_delivered(self, event: Event, action: Action, target: str,
                             error: ActuatorError, result: TurnResult) -> None:
        """Tell the person that the reply to EVENT, meant for TARGET, went nowhere, unless
        TARGET is where they asked (what refused the reply would refuse this too)."""
        asked = reply_action(event.channel, event.chat_id, "", self.config.chat.buffer)
        if target == event.channel and address_of(action) == address_of(asked):
            return
        where = f"{address_of(action)} on {target}" if target == event.channel else target
        await self.notify(event, f"System Error: the reply to {where} was not delivered "
                          f"({error}); it is kept in the archive, marked so.", result,
                          heading=False)

    async def stopped(self, event: Event, result: TurnResult, why: str) -> None:
        """End a turn whose tool loop stopped before the model answered (WHY: stopped by
        the person, a failure, the step limit): the steps done are kept, marked so, and
        the person is told once that is durable."""
        result.status = "aborted" if why.startswith("stopped") else "failed"
        steps = len(result.steps)
        message = f"{why} — the {steps} step{'s' if steps != 1 else ''} done are kept."
        result.text = message
        result.ids = await self.archive(
            event, result, message, role="system", turn_type="action",
            extra={"STATUS": result.status},
            durable=self.telling(event, message, result, error=result.status == "failed",
                                 heading=False))

    async def give_up(self, event: Event, verdict: Verdict, result: TurnResult) -> None:
        """End a turn whose reply was rejected: the error is archived, then said."""
        result.errors.extend(verdict.errors)
        reason = verdict.errors[0] if verdict.errors else "reply rejected"
        message = (f"System Error: {reason} — nothing was done; send the message again or "
                   "rephrase it.")
        result.text = message
        result.ids = await self.archive(event, result, message, role="system",
                                        durable=self.telling(event, message, result))

    # -- approval -------------------------------------------------------------

    def approval_request(self, event: Event, action: Action, skill: str | None, *,
                         preview: str = "") -> ApprovalRequest:
        """What a person is asked, from kernel facts (PREVIEW: a tool's own account of
        what its call would change); TurnFailed if it cannot be described."""
        common = {"thread": event.thread, "timeout": self.config.emacs.approval_timeout,
                  "skill": skill or "", "requested_by": self._decider(event),
                  "asked_in": event.message_id or "",
                  "digest": action_digest(action.printed())}
        if isinstance(action, ToolCall):
            return ApprovalRequest(action_class="tool", title=f"Use the tool {action.tool}",
                                   tool=action.tool, preview=preview,
                                   arguments=print_plist(action.args) if action.args else "",
                                   **common)
        if isinstance(action, ShellCommand):
            shell = self.shell()
            if shell is None:
                raise TurnFailed("this kernel has no shell actuator, so commands cannot run")
            try:
                return ApprovalRequest(
                    action_class=SHELL, title="Run a command", argv=tuple(argv_of(action)),
                    cwd=str(shell.working_directory(action)),
                    env=tuple(sorted(scrubbed_environment(shell.settings.keep_env))),
                    model_note=model_note(action.reason), **common)
            except ActuatorError as error:
                raise TurnFailed(f"cannot ask for approval: {error}") from error
        where = destination(action)
        if where is not None and not is_own(action, event, self.config.chat):
            return ApprovalRequest(action_class=CROSS_POST, title="Post to another conversation",
                                   target=str(where), text=action.reply_text or "", **common)
        plist = action.to_plist()
        target = str(plist.get("target", plist.get("type")))
        return ApprovalRequest(action_class=target, title=f"Carry out a :{target} action",
                               action=action.printed(), **common)

    def _decider(self, event: Event) -> str:
        """Who may decide an approval EVENT's turn asks for, besides configured approvers:
        its sender, unless that sender is a guest (a guest never approves anything)."""
        if archetype_for(event.thread, self.config.llm) == "guest":
            return ""
        return event.sender or ""

    async def hold_for_approval(self, event: Event, verdict: Verdict,
                                result: TurnResult) -> None:
        action = verdict.action
        assert action is not None
        result.status = "needs-approval"
        request = self.approval_request(event, action, result.skill)
        approver = self.approvers.get(event.channel)
        if approver is None:
            message = (f"{request.as_text()}\nThis channel cannot approve actions; "
                       "nothing was done.")
            result.text = message
            result.ids = await self.archive(event, result, action.printed(), turn_type="yield",
                                            durable=self.telling(event, message, result,
                                                                 error=False))
            return
        decision = await self.ask(approver, request)
        await self._after_decision(event, action, request, decision, result)

    async def ask(self, approver: Approver, request: ApprovalRequest) -> ApprovalDecision:
        """REQUEST put to APPROVER, timed and counted by outcome.  The request is shown
        before its turn is archived, by design: a turn is written whole, once decided
        (a crash while it waits loses the turn, the request with it)."""
        with self.telemetry.span("approval.wait", action_class=request.action_class) as span:
            decision = await approver.ask(request)
            span.set(outcome=decision.how)
        self.telemetry.count("approvals_total", outcome=decision.how,
                             action_class=request.action_class)
        return decision

    async def _after_decision(self, event: Event, action: Action, request: ApprovalRequest,
                              decision: ApprovalDecision, result: TurnResult) -> None:
        """Archive the decision (and, approved, the action's outcome), then tell the
        person.  The approved action itself is carried out before the write: what it
        did is part of what is archived."""
        log.info("approval %s (%s): %s", request.id, request.action_class, decision.how)
        summary = _summary(request)
        said = [(f"{decision.how}: {summary}", "yield")]
        if not decision.approved:
            result.status = "needs-approval"
            shown = f"Not done ({decision.how}): {summary}"
            tell = self.telling(event, shown, result, error=False)
        else:
            shown = await self._carry_out_approved(event, action, result)
            said.append((shown, "action"))
            tell = self.telling(event, shown, result, error=shown.startswith("System Error"),
                                heading=False)
        result.text = shown
        result.ids = await self.archive_many(event, result, [
            ("assistant", action.printed(), "yield"),
            *[("system", text, kind) for text, kind in said]], durable=tell)

    async def _carry_out_approved(self, event: Event, action: Action,
                                  result: TurnResult) -> str:
        """Do the approved ACTION (a message or another action a skill held for a person;
        commands and tool calls are steps, `opencortex.steps`); what the person is to be
        told (once it is archived)."""
        result.status = "done"
        try:
            target = str(action.to_plist().get("target"))
            outcome = await self.actuators.for_target(target).carry_out(action, event)
            where = destination(action)
            return f"Done: sent to {where}." if where else f"Done: {outcome.result or ''}"
        except ActuatorError as error:
            result.errors.append(str(error))
            return f"System Error: {error}"

    def shell(self) -> ShellActuator | None:
        try:
            actuator = self.actuators.for_target("shell")
        except ActuatorError:
            return None
        return actuator if isinstance(actuator, ShellActuator) else None

    # -- telling and keeping --------------------------------------------------

    def telling(self, event: Event, text: str, result: TurnResult, *,
                error: bool = True, heading: bool = True) -> WhenDurable:
        """The durable hook of a turn that ends by telling the person TEXT (`notify`):
        said only once the turn is durable, so a crash never leaves the person having
        seen what the archive lacks; when it does not reach them, the turn's last
        record (what says it) is marked undelivered."""
        async def tell(records: list[MessageRecord]) -> None:
            if not await self.notify(event, text, result, error=error, heading=heading):
                await self.conversations.mark_undelivered(
                    event.thread, records[-1].id, result.errors[-1])
        return tell

    async def notify(self, event: Event, text: str, result: TurnResult, *,
                     error: bool = True, heading: bool = True) -> bool:
        """Tell the person on EVENT's channel; never raise.  True if it reached them.

        Said at once, so only for what is never archived (a slash command's answer, a
        failure that keeps nothing, a notice) or what its turn archives later by design
        (a tool step's line, said while the loop runs; a crash before the turn's write
        loses the whole turn, steps included); a turn's own ending goes through
        `telling`."""
        shown = f"* {text}" if event.channel == "emacs" and heading else text
        action = reply_action(event.channel, event.chat_id, shown, self.config.chat.buffer)
        try:
            actuator = self.actuators.for_target(event.channel)
            if error and isinstance(actuator, MessageActuator):
                await actuator.show_error(address_of(action), shown)
            else:
                await actuator.carry_out(action, event)
            return True
        except ActuatorError as error_:
            result.errors.append(f"could not tell the person: {error_}")
            return False

    async def archive(self, event: Event, result: TurnResult, reply: str, *,
                      role: str = "assistant", turn_type: str = "speech",
                      extra: dict[str, str] | None = None,
                      durable: WhenDurable | None = None) -> list[str]:
        """Write the turn: the person's message and the answer, in one append."""
        return await self.archive_many(event, result, [(role, reply, turn_type)], extra,
                                       durable=durable)

    async def archive_many(self, event: Event, result: TurnResult,
                           replies: list[tuple[str, str, str]],
                           extra: dict[str, str] | None = None, *,
                           durable: WhenDurable | None = None
                           ) -> list[str]:
        """Archive the turn on the thread's current branch (DURABLE awaited once the write
        is durable; EXTRA: fields of the REPLIES, not of the tool steps before them);
        tell the person when the working context was compressed to make room."""
        usage = result.usage
        metrics = {"SKILL": result.skill or "", "BACKEND": result.backend,
                   "LATENCY_MS": f"{1000 * (time.perf_counter() - result.started):.1f}",
                   "TOKENS_IN": str(usage.input_tokens if usage else 0),
                   "TOKENS_OUT": str(usage.output_tokens if usage else 0)}
        said = {PLATFORM_ID: event.message_id} if event.message_id else {}
        if event.sender_name:
            said[SENDER_NAME] = event.sender_name
        messages = [NewMessage(role="user", text=event.text, thread=event.thread,
                               sender=event.sender, timestamp=event.said_at.timestamp(),
                               extra=said)]
        for step in result.steps:   # the tool loop's steps, each linked to this turn
            number = {STEP: str(step.number), STEP_OUTCOME: step.outcome}
            messages += [NewMessage(role="assistant", text=step.call, thread=event.thread,
                                    turn_type="action", extra=number),
                         NewMessage(role="system", text=step.result, thread=event.thread,
                                    turn_type="action", extra=number)]
        messages += [NewMessage(role=role, text=text, thread=event.thread, turn_type=kind,
                                extra=dict(extra or {})) for role, text, kind in replies]
        records, report = await self.conversations.record_turn(
            event.thread, messages, metrics, pin=result.pinned, durable=durable)
        if report is not None:      # a notice, never archived: said after the turn's own
            await self.notify(event, f"Context compressed ({report.strategy}): {report.notes}",
                              result, error=False, heading=False)
        return [record.id for record in records]


def _summary(request: ApprovalRequest) -> str:
    """One line naming what was asked, for the archive and the person."""
    if request.target:
        return f"a message to {request.target}"
    return request.action
