"""The loop: perceive → trigger → probabilistic → LLM → read → verify → act → archive.

One event is one turn.  Turns of one thread run one after another; turns of
different threads run concurrently.  A turn is atomic: if it fails before
anything reaches the person, nothing of it is archived; the person is told why.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from opencortex.actions import Action, Log, Response, ShellCommand, ToolCall, reply_action
from opencortex.actuators import ActuatorError, ActuatorRegistry, MessageActuator, Outcome
from opencortex.actuators.base import address_of
from opencortex.actuators.shell import ShellActuator, argv_of
from opencortex.approvals import ApprovalDecision, ApprovalRequest, Approver
from opencortex.config import Config
from opencortex.conversation.commands import CommandError, CommandInput, Commands, is_command
from opencortex.conversation.conversations import Conversation, Conversations
from opencortex.conversation.session import InvalidTransition
from opencortex.events import Event, Thread, parse_event
from opencortex.llm import Backend, LLMError, PromptRequest, ReplyAddress, Usage
from opencortex.llm.routing import archetype_for
from opencortex.memory import Archive, NewMessage
from opencortex.skills import Skill, SkillContext, SkillRegistry
from opencortex.tools import ToolRegistry
from opencortex.turn import ThreadStats, TurnObserver, TurnResult
from opencortex.verification import Verdict, judge

log = logging.getLogger(__name__)


class TurnFailed(Exception):
    """Internal: a turn stops here; the message is what the person is told."""


class Kernel:
    """Runs turns.  Built by `opencortex.runtime.build_kernel`."""

    def __init__(self, *, config: Config, skills: SkillRegistry, backend: Backend,
                 actuators: ActuatorRegistry, archive: Archive, tools: ToolRegistry,
                 conversations: Conversations, persona: str = ""):
        self.config = config
        self.skills = skills
        self.backend = backend
        self.actuators = actuators
        self.archive = archive
        self.tools = tools
        self.persona = persona
        self.conversations = conversations
        self.commands = Commands(conversations)
        self.approvers: dict[str, Approver] = {}
        self.stats: dict[Thread, ThreadStats] = {}
        self._locks: weakref.WeakValueDictionary[Thread, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    # -- entry --------------------------------------------------------------

    async def handle(self, event: Event | dict[str, Any], observer: TurnObserver | None = None,
                     turn_id: str | None = None) -> TurnResult:
        """Run one turn for EVENT (raises EventError for an invalid event, changing nothing).

        Cancelling the task that awaits this aborts the turn: before actuation nothing
        of it is archived; once actuation started, it completes."""
        event = parse_event(event)
        lock = self._locks.get(event.thread)
        if lock is None:
            lock = self._locks[event.thread] = asyncio.Lock()
        result = TurnResult(event.thread, "failed", self.backend.name)
        result.turn_id = turn_id or result.turn_id
        async with lock:
            started = result.started = time.perf_counter()
            if self.backend.warning:
                result.warnings.append(self.backend.warning)
            try:
                if is_command(event.text):
                    await self._command(event, result)
                    return result
                await self._turn(event, result, observer or TurnObserver())
            except TurnFailed as failure:
                result.errors.append(str(failure))
                await self._notify(event, f"System Error: {failure} — nothing of this turn "
                                   "was kept; send the message again when that is fixed.", result)
            result.elapsed_s = time.perf_counter() - started
            self._count(event.thread, result)
            return result

    def _count(self, thread: Thread, result: TurnResult) -> None:
        stats = self.stats.setdefault(thread, ThreadStats())
        stats.turns += 1
        stats.total_latency_s += result.elapsed_s
        usage = result.usage
        if usage is not None:
            stats.input_tokens = usage.input_tokens
            stats.output_tokens += usage.output_tokens
            if usage.cost_usd is None:
                stats.unpriced_turns += 1
            else:
                stats.cost_usd += usage.cost_usd
            if usage.fallback_reason:
                result.warnings.append(usage.fallback_reason)

    # -- the turn -----------------------------------------------------------

    async def context(self, event: Event) -> SkillContext:
        """What skills see for EVENT: its thread's working context and what was recalled
        for it (same owner only) — never the kernel itself, never another thread."""
        chat = self.config.chat
        conversation = await self.conversations.open(event.thread)
        recalled = await self.conversations.remember(event.thread, event.text)
        settings = {"buffer": chat.buffer, "allowed-buffers": list(chat.allowed_buffers),
                    "history-chars": chat.history_chars}
        return SkillContext(event=event, thread=event.thread,
                            history=list(conversation.context.entries), recalled=recalled,
                            persona=self.persona, config=settings,
                            tools=self.tools.descriptions())

    async def run_command(self, thread: Thread, text: str) -> str:
        """Run the slash command TEXT in THREAD; CommandError (a ValueError) if it is misused."""
        conversation = await self.conversations.open(thread)
        given = CommandInput(persona=self.persona, metrics=self._metrics(thread))
        try:
            return await self.commands.run(conversation, text, given)
        except InvalidTransition as error:
            raise CommandError(str(error)) from None

    async def _command(self, event: Event, result: TurnResult) -> None:
        """A slash command: answered on the channel, never sent to the model."""
        try:
            answer = await self.run_command(event.thread, event.text)
        except ValueError as error:
            result.status = "failed"
            result.errors.append(str(error))
            await self._notify(event, str(error), result, heading=False)
            return
        result.status, result.text = "done", answer
        await self._notify(event, answer, result, error=False, heading=False)

    def _metrics(self, thread: Thread) -> dict[str, Any]:
        stats = self.stats.get(thread, ThreadStats())
        return {"kernel turns": stats.turns, "tokens in (last)": stats.input_tokens,
                "tokens out": stats.output_tokens, "cost (USD)": round(stats.cost_usd, 6),
                "average latency (ms)": round(stats.average_latency_ms, 1),
                "backend": self.backend.name}

    async def view(self, thread: Thread) -> dict[str, Any]:
        """What a frontend may show about THREAD (never prompts)."""
        conversation = await self.conversations.open(thread)
        stats = self.stats.get(thread, ThreadStats())
        context, session = conversation.context, conversation.session
        return {"turn": conversation.log.turn_count(),
                "context-percent": round(100 * context.pressure, 1),
                "context-state": context.state, "session": session.state,
                "can-send": session.state not in ("collapsed", "draining"),
                "branch": conversation.log.branch,
                "cost-usd": round(stats.cost_usd, 6),
                "latency-ms": round(stats.average_latency_ms, 1),
                "backend": self.backend.name, "warning": self.backend.warning,
                "memory-file": str(self.archive.thread_file(thread))}

    async def _turn(self, event: Event, result: TurnResult, observer: TurnObserver) -> None:
        conversation = await self.conversations.open(event.thread)
        session = conversation.session
        if session.state == "collapsed":
            result.status = "failed"
            raise TurnFailed(f"this session has collapsed: {session.collapse_reason}")
        if session.state == "dormant":
            session.to("ready")
        ctx = await self.context(event)
        session.to("streaming")
        try:
            await self._run(event, ctx, conversation, result, observer)
        finally:
            if session.state in ("streaming", "waiting"):
                session.to("ready")

    async def _run(self, event: Event, ctx: SkillContext, conversation: Conversation,
                   result: TurnResult, observer: TurnObserver) -> None:
        skill = next((s for s in self.skills.matching(ctx) if s.probabilistic), None)
        if skill is None:
            result.status = "no-skill"
            raise TurnFailed("no skill handles this message (is skills/chat.org loaded? "
                             "run `opencortex skills --check`)")
        result.skill = skill.name
        request = self._prompt(skill, ctx)
        verdict = await self._ask_until_valid(skill, request, ctx, result, observer)
        if verdict.status == "rejected":
            result.status = "rejected"
            await self._give_up(event, verdict, result)
            return
        assert verdict.action is not None
        result.action = verdict.action.to_plist()
        # From here on the person sees effects: finish even if the turn is aborted.
        if verdict.status == "needs-approval":
            conversation.session.to("waiting")
            await asyncio.shield(self._hold_for_approval(event, verdict, result))
            return
        await asyncio.shield(self._act(event, verdict.action, result))

    def _prompt(self, skill: Skill, ctx: SkillContext) -> PromptRequest:
        try:
            built = skill.probabilistic(ctx)
        except Exception as error:
            log.warning("probabilistic phase of %s failed: %s", skill.name, type(error).__name__)
            raise TurnFailed(f"skill {skill.name} failed to build a prompt "
                             f"({type(error).__name__}: {error})") from error
        try:
            request = built if isinstance(built, PromptRequest) else \
                PromptRequest.model_validate(dict(built or {}))
        except (ValidationError, TypeError, ValueError) as error:
            raise TurnFailed(f"skill {skill.name} built an invalid prompt request: "
                             f"{str(error).splitlines()[0]}") from None
        event = ctx.event
        address = ReplyAddress(channel=event.channel, chat_id=event.chat_id,
                               buffer=self.config.chat.buffer)
        routing = {"archetype": archetype_for(event.thread, self.config.llm),
                   "skill": skill.name, "channel": event.channel}
        return request.model_copy(update={"reply_to": address, "routing": routing})

    async def _ask_until_valid(self, skill: Skill, request: PromptRequest, ctx: SkillContext,
                               result: TurnResult, observer: TurnObserver) -> Verdict:
        verdict = Verdict("rejected")
        for attempt in range(self.config.max_rejections + 1):
            result.attempts = attempt + 1
            reply = await self._ask(request, result, observer)
            verdict = judge(reply, self.skills.skills, ctx, self.tools,
                            max_bytes=self.config.max_reply_bytes,
                            max_depth=self.config.max_reply_depth)
            if verdict.status != "rejected":
                return verdict
            log.info("reply rejected (skill %s, attempt %d, %d reasons)",
                     skill.name, attempt + 1, len(verdict.errors))
            reason = "; ".join(verdict.errors)
            request = request.with_retry_note(reply, reason)
            ctx = replace(ctx, attempt=attempt + 1, rejections=[*ctx.rejections, reason])
        return verdict

    async def _ask(self, request: PromptRequest, result: TurnResult,
                   observer: TurnObserver) -> str:
        chunks: list[str] = []
        try:
            async with asyncio.timeout(self.config.llm_timeout):
                async for item in self.backend.stream(request):
                    if isinstance(item, Usage):
                        result.usage = item
                        continue
                    chunks.append(item)
                    observer.on_chunk(item)
            observer.on_reply_done()
        except LLMError as error:
            raise TurnFailed(f"{error.code}: {error.message}") from error
        except TimeoutError:
            raise TurnFailed(f"STREAM_TIMEOUT: the {self.backend.name} backend did not finish "
                             f"within {self.config.llm_timeout:g} s; send the message again")
        return "".join(chunks)

    # -- endings ------------------------------------------------------------

    async def _act(self, event: Event, action: Action, result: TurnResult) -> None:
        if isinstance(action, Log):
            result.status = "done"
            result.ids = await self._archive(event, result, action.text, turn_type="thought")
            return
        if isinstance(action, Response):
            action = reply_action(event.channel, event.chat_id, action.text,
                                  self.config.chat.buffer)
        target = str(action.to_plist().get("target"))
        try:
            outcome = await self.actuators.for_target(target).carry_out(action, event)
        except ActuatorError as error:
            result.errors.append(str(error))
            if action.reply_text is None:
                raise TurnFailed(str(error)) from error
            # The reply exists and was verified: keep it, marked undelivered.
            result.status = "failed"
            result.text = action.reply_text
            result.ids = await self._archive(event, result, action.reply_text,
                                             extra={"DELIVERY": "failed"})
            return
        result.status = "done"
        await self._finish(event, action, outcome, result)

    async def _finish(self, event: Event, action: Action, outcome: Outcome,
                      result: TurnResult) -> None:
        if isinstance(action, ToolCall):
            text = f"Tool {action.tool}: {outcome.result}"
            await self._notify(event, text, result, error=False)
            result.text = text
            result.ids = await self._archive(event, result, text, role="system",
                                             turn_type="action")
            return
        result.text = outcome.shown if outcome.shown is not None else action.reply_text
        result.ids = await self._archive(event, result, result.text or "")

    async def _give_up(self, event: Event, verdict: Verdict, result: TurnResult) -> None:
        result.errors.extend(verdict.errors)
        reason = verdict.errors[0] if verdict.errors else "reply rejected"
        message = (f"System Error: {reason} — nothing was done; send the message again or "
                   "rephrase it.")
        if await self._notify(event, message, result):
            result.text = message
            result.ids = await self._archive(event, result, message, role="system")

    async def _hold_for_approval(self, event: Event, verdict: Verdict,
                                 result: TurnResult) -> None:
        action = verdict.action
        assert action is not None
        result.status = "needs-approval"
        proposed = action.printed()
        approver = self.approvers.get(event.channel)
        shell = self._shell()
        if approver is None or shell is None or not isinstance(action, ShellCommand):
            message = (f"Needs your approval, not run: {proposed}\n"
                       f"Why: {verdict.approval_reason}\n"
                       "This channel cannot approve actions; nothing was run.")
            await self._notify(event, message, result, error=False)
            result.text = message
            result.ids = await self._archive(event, result, proposed, turn_type="yield")
            return
        try:
            request = ApprovalRequest(thread=event.thread, argv=tuple(argv_of(action)),
                                      cwd=str(shell.working_directory(action)),
                                      reason=verdict.approval_reason or "",
                                      timeout=self.config.emacs.approval_timeout)
        except ActuatorError as error:
            raise TurnFailed(f"cannot ask for approval: {error}") from error
        decision = await approver.ask(request)
        await self._after_decision(event, action, request, decision, shell, result)

    async def _after_decision(self, event: Event, action: ShellCommand, request: ApprovalRequest,
                              decision: ApprovalDecision, shell: ShellActuator,
                              result: TurnResult) -> None:
        log.info("approval %s: %s", request.id, decision.how)
        said = [(f"{decision.how}: {request.command} (in {request.cwd})", "yield")]
        if decision.approved:
            result.status = "done"
            try:
                outcome = await shell.run_approved(action, decision)
                shown = outcome.result or ""
            except ActuatorError as error:
                result.errors.append(str(error))
                shown = f"System Error: {error}"
            await self._notify(event, shown, result, error=shown.startswith("System Error"),
                               heading=False)
            said.append((shown, "action"))
        else:
            result.status = "needs-approval"
            shown = f"Not run ({decision.how}): {request.command}"
            await self._notify(event, shown, result, error=False)
        result.text = shown
        result.ids = await self._archive_many(event, result, [
            ("assistant", action.printed(), "yield"),
            *[("system", text, kind) for text, kind in said]])

    def _shell(self) -> ShellActuator | None:
        try:
            actuator = self.actuators.for_target("shell")
        except ActuatorError:
            return None
        return actuator if isinstance(actuator, ShellActuator) else None

    async def _notify(self, event: Event, text: str, result: TurnResult, *,
                      error: bool = True, heading: bool = True) -> bool:
        """Tell the person on EVENT's channel; never raise.  True if it reached them."""
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

    async def _archive(self, event: Event, result: TurnResult, reply: str, *,
                       role: str = "assistant", turn_type: str = "speech",
                       extra: dict[str, str] | None = None) -> list[str]:
        """Write the turn: the person's message and the answer, in one append."""
        return await self._archive_many(event, result, [(role, reply, turn_type)], extra)

    async def _archive_many(self, event: Event, result: TurnResult,
                            replies: list[tuple[str, str, str]],
                            extra: dict[str, str] | None = None) -> list[str]:
        """Archive the turn on the thread's current branch; tell the person when the
        working context was compressed to make room."""
        usage = result.usage
        metrics = {"SKILL": result.skill or "", "BACKEND": result.backend,
                   "LATENCY_MS": f"{1000 * (time.perf_counter() - result.started):.1f}",
                   "TOKENS_IN": str(usage.input_tokens if usage else 0),
                   "TOKENS_OUT": str(usage.output_tokens if usage else 0), **(extra or {})}
        messages = [NewMessage(role="user", text=event.text, thread=event.thread,
                               sender=event.sender, timestamp=event.received_at.timestamp())]
        messages += [NewMessage(role=role, text=text, thread=event.thread, turn_type=kind)
                     for role, text, kind in replies]
        records, report = await self.conversations.record_turn(event.thread, messages, metrics)
        if report is not None:
            await self._notify(event, f"Context compressed ({report.strategy}): {report.notes}",
                               result, error=False, heading=False)
        return [record.id for record in records]

    async def aclose(self) -> None:
        await self.backend.aclose()
        await self.actuators.aclose()
        self.archive.close()
