"""The loop: perceive → trigger → probabilistic → LLM → read → verify → act → archive.

One event is one turn.  Turns of one thread run one after another; turns of
different threads run concurrently.  A turn is atomic: if it fails before
anything reaches the person, nothing of it is archived; the person is told why.
Up to the prompt (recall, triggers, the probabilistic phase) a turn is prepared
on a reading thread (`preparation`); judging runs on a worker thread and the
archive's writes on its writer thread: the loop routes and streams.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import weakref
from functools import partial
from typing import Any, Callable

from opencortex.actuation import Actuation
from opencortex.actuators import ActuatorRegistry
from opencortex.approvals import Approver
from opencortex.budgets import Budgets
from opencortex.config import Config
from opencortex.conversation.commands import CommandError, CommandInput, Commands, is_command
from opencortex.conversation.conversations import Conversation, Conversations
from opencortex.conversation.session import InvalidTransition
from opencortex.events import Event, Thread, parse_event
from opencortex.llm import Backend, PromptRequest
from opencortex.llm.routing import archetype_for
from opencortex.memory import Archive
from opencortex.replies import Replies
from opencortex.skills import Skill, SkillContext, SkillRegistry
from opencortex.telemetry import telemetry_for, turn_span
from opencortex.tools import ToolRegistry
from opencortex.preparation import Prepared, Preparation
from opencortex.turn import RecentThreadStats, ThreadStats, TurnFailed, TurnObserver, TurnResult
from opencortex.steps import Narrowing, StepRunner, is_step
from opencortex.verification import Verdict

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL = 0.001  # seconds; see Kernel.__init__


class Kernel:
    """Runs turns.  Built by `opencortex.runtime.build_kernel`."""

    def __init__(self, *, config: Config, skills: SkillRegistry, backend: Backend,
                 actuators: ActuatorRegistry, archive: Archive, tools: ToolRegistry,
                 conversations: Conversations, persona: str = ""):
        self.config = config
        self.skills = skills
        self.actuators = actuators
        self.archive = archive
        self.tools = tools
        self.persona = persona
        self.conversations = conversations
        self.commands = Commands(conversations)
        self.budgets = Budgets.from_config(config)
        self.telemetry = telemetry_for(config.telemetry)
        self.approvers: dict[str, Approver] = {}
        # Parts that run inside the kernel (bridges, MCP servers) report their state for
        # /metrics, each under its label.
        self.reporters: dict[str, Callable[[], str]] = {}
        self.mcp: Any = None   # opencortex.tools.mcp.McpServers, once started
        self.actuation = Actuation(config=config, actuators=actuators,
                                   conversations=conversations, approvers=self.approvers,
                                   telemetry=self.telemetry)
        self.replies = Replies(config=config, backend=backend, skills=skills, tools=tools,
                               budgets=self.budgets, telemetry=self.telemetry,
                               can_ask=self.can_ask)
        self.preparation = Preparation(config=config, skills=skills, tools=tools,
                                       conversations=conversations, telemetry=self.telemetry)
        self.steps = StepRunner(self.actuation, actuators.for_target("tool"),
                                config.tools.result_chars)
        # Worker threads share the GIL with the loop: with Python's default 5 ms switch
        # interval every wake-up of the loop can wait 5 ms behind a judging thread, which
        # adds up to 100s of ms per turn; 1 ms keeps other threads' turns within a few ms.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL))
        self.stats = RecentThreadStats()
        self._locks: weakref.WeakValueDictionary[Thread, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    @property
    def backend(self) -> Backend:
        """The model backend turns ask (replaceable: `kernel.backend = other`)."""
        return self.replies.backend

    @backend.setter
    def backend(self, backend: Backend) -> None:
        self.replies.backend = backend

    async def start(self, *, wait: bool = True) -> None:
        """Start what runs beside the turns: the configured MCP servers, whose tools join
        the registry as each comes up (with WAIT, once every one started or failed)."""
        if not self.config.mcp.servers or self.mcp is not None:
            return
        try:
            from opencortex.tools.mcp import McpServers
        except ImportError:
            log.warning("MCP servers are configured but the mcp extra is not installed")
            self.reporters["mcp servers"] = lambda: (
                "not started: install the mcp extra (bash kernel/install.sh mcp)")
            return
        self.mcp = McpServers(self.config.mcp, self.tools, log_dir=self.config.home / "logs")
        self.reporters["mcp servers"] = self.mcp.report
        await self.mcp.start(wait=wait)

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
            with turn_span(self.telemetry, result):
                return await self._handle(event, result, observer)

    async def _handle(self, event: Event, result: TurnResult,
                      observer: TurnObserver | None) -> TurnResult:
        """The turn (or command) of EVENT, its thread's lock held."""
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
            result.retry_after_seconds = failure.retry_after_seconds
            await self.actuation.notify(event, f"System Error: {failure} — nothing of this turn "
                               "was kept; send the message again when that is fixed.", result)
        result.elapsed_s = time.perf_counter() - started
        self._count(event.thread, result)
        return result

    def _count(self, thread: Thread, result: TurnResult) -> None:
        stats = self.stats.of(thread)
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

    async def run_command(self, thread: Thread, text: str) -> str:
        """Run the slash command TEXT in THREAD; CommandError (a ValueError) if it is misused."""
        conversation = await self.conversations.open(thread)
        given = CommandInput(persona=self.persona, metrics=self._metrics(thread),
                             skills=self.skills, budget=self.budgets.describe(thread),
                             guest=archetype_for(thread, self.config.llm) == "guest")
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
            await self.actuation.notify(event, str(error), result, heading=False)
            return
        result.status, result.text = "done", answer
        await self.actuation.notify(event, answer, result, error=False, heading=False)

    def _metrics(self, thread: Thread) -> dict[str, Any]:
        stats = self.stats.get(thread, ThreadStats())
        return {"kernel turns": stats.turns, "tokens in (last)": stats.input_tokens,
                "tokens out": stats.output_tokens, "cost (USD)": round(stats.cost_usd, 6),
                "average latency (ms)": round(stats.average_latency_ms, 1),
                "backend": self.backend.name,
                **{name: report() for name, report in self.reporters.items()}}

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
                "cost-known": stats.unpriced_turns == 0,
                "latency-ms": round(stats.average_latency_ms, 1),
                "backend": self.backend.name, "warning": self.backend.warning,
                "memory-file": ("(working memory only: this channel is not archived)"
                                if thread.channel in self.conversations.unarchived
                                else str(self.archive.thread_file(thread)))}

    async def _turn(self, event: Event, result: TurnResult, observer: TurnObserver) -> None:
        conversation = await self.conversations.open(event.thread)
        session = conversation.session
        if session.state == "collapsed":
            result.status = "failed"
            raise TurnFailed(f"this session has collapsed: {session.collapse_reason}")
        if session.state == "dormant":
            session.to("ready")
        prepared = await self.preparation.prepare(event, conversation, self.persona)
        session.to("streaming")
        try:
            await self._run(event, prepared, conversation, result, observer)
            self.telemetry.measure("chat_context_utilization", conversation.context.pressure)
            notice = self.budgets.collapse_notice(session, self.config.conversation)
            if notice:
                result.warnings.append(notice)
                await self.actuation.notify(event, notice, result, error=False, heading=False)
        finally:
            if session.state in ("streaming", "waiting"):
                session.to("ready")

    async def _run(self, event: Event, prepared: Prepared, conversation: Conversation,
                   result: TurnResult, observer: TurnObserver) -> None:
        skill, ctx = prepared.skill, prepared.ctx
        if skill is None:
            result.status = "no-skill"
            raise TurnFailed("no skill handles this message (is skills/chat.org loaded? "
                             "run `opencortex skills --check`)")
        result.skill, result.pinned = skill.name, skill.pins_turn
        tier = await self.budgets.admit(
            event, can_ask=self.can_ask(event), approver=self.approvers.get(event.channel),
            ask=self.actuation.ask,
            tell=partial(self.actuation.notify, event, result=result, error=False, heading=False),
            timeout=self.config.emacs.approval_timeout)
        if prepared.request is None:
            raise prepared.failure or TurnFailed(f"skill {skill.name} built no prompt")
        request = self.budgets.route(prepared.request, tier)
        try:
            verdict = await self._steps(skill, request, ctx, conversation, result, observer)
        except (TurnFailed, asyncio.CancelledError) as stop:
            if not result.steps:
                raise
            why = (f"System Error: {stop}" if isinstance(stop, TurnFailed)
                   else "stopped by the person")
            await asyncio.shield(self.actuation.stopped(event, result, why))
            if isinstance(stop, asyncio.CancelledError):
                raise
            return
        if verdict is None:
            return
        if verdict.status == "needs-approval":
            conversation.session.to("waiting")
        target = verdict.action.to_plist().get("target") if verdict.action else None
        with self.telemetry.span("actuate", target=str(target) if target else None):
            await self.actuation.finish(event, verdict, result)

    async def _steps(self, skill: Skill, request: PromptRequest, ctx: SkillContext,
                     conversation: Conversation, result: TurnResult,
                     observer: TurnObserver) -> Verdict | None:
        """The tool loop: ask, and while the model asks for a tool or a command, carry
        it out (asking a person first when the policy says so) and give it the result;
        the verdict on its answer, or None when the loop stopped (and was recorded)."""
        event = ctx.event
        limit = self.config.tools.max_steps
        narrowing = Narrowing()
        while True:
            verdict, request, reply = await self.replies.until_valid(
                skill, request, ctx, result, observer)
            if not is_step(verdict):
                return verdict
            verdict = narrowing.applied(verdict)
            if len(result.steps) >= limit:
                await self.actuation.stopped(event, result, (
                    f"Stopped: the model asked for more than {limit} tool steps in one turn "
                    "([tools] max_steps)"))
                return None
            if any(scope.share >= 1 for scope in self.budgets.scopes(event.thread)):
                await self.actuation.stopped(event, result, (
                    "Stopped: the token budget is used up; /budget shows it"))
                return None
            conversation.session.to("waiting")
            step = await self.steps.run(event, verdict, result, can_ask=self.can_ask(event))
            narrowing.after(step, verdict.action, self.skills.docs)
            conversation.session.to("streaming")
            request = request.with_step_result(reply, step.for_model())

    def can_ask(self, event: Event) -> bool:
        """Whether an approval for EVENT's turn can be asked of its owner: the channel
        has an approver and whoever writes there is not a guest."""
        return (event.channel in self.approvers
                and archetype_for(event.thread, self.config.llm) != "guest")

    async def aclose(self) -> None:
        if self.mcp is not None:
            await self.mcp.aclose()
        self.replies.close()
        await self.backend.aclose()
        await self.actuators.aclose()
        self.conversations.close()
        await asyncio.to_thread(self.archive.close)    # pending writes first (bounded)
        self.budgets.close()
