"""Getting a judged reply from the model: stream it, judge it off the loop, re-ask.

`Replies.until_valid` is one model step of a turn: it streams the reply to the
turn's observer, reads and judges it in a worker thread (bounded by
`judge_timeout`; a hostile reply must not stall other threads), asks again
with the reasons when it is rejected (up to `max_rejections` times), then
applies the kernel's own rules that no skill can lift: pinning to the event's
conversation (`opencortex.pinning`) and the approval policy
(`opencortex.policy` via `opencortex.steps.ruled`).  What each reply cost is
charged to the thread's budgets as it arrives (a reply cut off, as estimated).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from dataclasses import replace
from functools import partial
from typing import Callable

from opencortex.budgets import Budgets
from opencortex.config import Config
from opencortex.events import Event
from opencortex.llm import Backend, LLMError, PromptRequest, Thinking, Usage
from opencortex.llm.cost import cut_reply_usage
from opencortex.llm.routing import archetype_for
from opencortex.pinning import pin
from opencortex.policy import ApprovalPolicy
from opencortex.skills import Skill, SkillContext, SkillRegistry
from opencortex.steps import ruled
from opencortex.telemetry import Telemetry
from opencortex.tools import ToolRegistry
from opencortex.turn import TurnFailed, TurnObserver, TurnResult
from opencortex.verification import Verdict, judge
from opencortex.workers import Workers

log = logging.getLogger(__name__)


def added(total: Usage | None, more: Usage) -> Usage:
    """TOTAL and MORE together: tokens and cost summed (cost unknown if either is)."""
    if total is None:
        return more
    cost = None if total.cost_usd is None or more.cost_usd is None \
        else total.cost_usd + more.cost_usd
    return more.model_copy(update={
        "input_tokens": total.input_tokens + more.input_tokens,
        "output_tokens": total.output_tokens + more.output_tokens,
        "cache_read_tokens": total.cache_read_tokens + more.cache_read_tokens,
        "cache_write_tokens": total.cache_write_tokens + more.cache_write_tokens,
        "latency_s": total.latency_s + more.latency_s, "cost_usd": cost,
        "estimated": total.estimated or more.estimated,
        "fallback_reason": more.fallback_reason or total.fallback_reason})


# Why a rejected reply ended, when its provider says it did not end of itself.
STOPPED_SHORT = {
    "max_tokens": "the reply reached the model's output limit (max_tokens) before it ended: "
                  "it has to be shorter",
    "refusal": "the model declined to answer (its provider ended the reply as a refusal)",
}


class Replies:
    """Asks the backend and judges what it says, for the kernel's turns."""

    def __init__(self, *, config: Config, backend: Backend, skills: SkillRegistry,
                 tools: ToolRegistry, budgets: Budgets, telemetry: Telemetry,
                 can_ask: Callable[[Event], bool]):
        self.config = config
        self.backend = backend
        self.skills = skills
        self.tools = tools
        self.budgets = budgets
        self.telemetry = telemetry
        self.can_ask = can_ask
        self.policy = ApprovalPolicy(config.approvals)
        # Two workers so one slow reply blocks nobody; one that hangs is given up.
        self._judges = Workers(2, "opencortex-judge")

    async def until_valid(self, skill: Skill, request: PromptRequest, ctx: SkillContext,
                          result: TurnResult, observer: TurnObserver
                          ) -> tuple[Verdict, PromptRequest, str]:
        """The verdict on the first reply not rejected (or the last one), the request as
        it then stands (with any re-ask notes), and that reply's text."""
        verdict, reply = Verdict("rejected"), ""
        for attempt in range(self.config.max_rejections + 1):
            result.attempts += 1
            reply = await self.ask(request, result, observer)
            verdict = await self.judged(reply, ctx)
            if verdict.status != "rejected":
                return verdict, request, reply
            stopped = result.usage.stop_reason if result.usage is not None else ""
            if stopped in STOPPED_SHORT:    # say why first: the reader's errors follow from it
                verdict = replace(verdict, errors=[STOPPED_SHORT[stopped], *verdict.errors])
                if stopped == "refusal":    # asked again, it declines again (and is paid)
                    return verdict, request, reply
            self.telemetry.count("chat_rejections_total", skill=skill.name)
            log.info("reply rejected (skill %s, attempt %d, %d reasons)",
                     skill.name, attempt + 1, len(verdict.errors))
            reason = "; ".join(verdict.errors)
            request = request.with_retry_note(reply, reason)
            ctx = replace(ctx, attempt=attempt + 1, rejections=[*ctx.rejections, reason])
        return verdict, request, reply

    async def judged(self, reply: str, ctx: SkillContext) -> Verdict:
        """REPLY read and judged in a worker thread, bounded by `judge_timeout`; then
        pinned to the event's own conversation and ruled on by the approval policy,
        whatever skills said."""
        call = partial(judge, reply, self.skills.skills, ctx, self.tools,
                       max_bytes=self.config.max_reply_bytes,
                       max_depth=self.config.max_reply_depth,
                       max_elements=self.config.max_reply_elements)
        limit = self.config.judge_timeout
        try:
            with self.telemetry.span("verify") as span:
                verdict = await self._judges.run_within(limit, call)
                span.set(status=verdict.status)
        except TimeoutError:
            log.warning("judging a reply of %d characters took over %g s", len(reply), limit)
            return Verdict("rejected", errors=[
                f"judging this reply took longer than {limit:g} s; send a shorter, "
                "simpler reply"])
        event = ctx.event
        verdict = pin(verdict, event, self.config.chat, can_ask=self.can_ask(event))
        return ruled(verdict, event, self.policy, self.tools, chat=self.config.chat,
                     archetype=archetype_for(event.thread, self.config.llm))

    async def ask(self, request: PromptRequest, result: TurnResult,
                  observer: TurnObserver) -> str:
        """One reply to REQUEST, streamed to OBSERVER; its cost charged to the budgets."""
        chunks: list[str] = []
        paid = False
        size, limit = 0, self.config.max_reply_bytes
        thought = 0                   # thinking shown (at most LIMIT characters a reply)
        try:
            with self.telemetry.span("llm.stream", backend=self.backend.name) as span:
                async with asyncio.timeout(self.config.llm_timeout), \
                        aclosing(self.backend.stream(request)) as stream:
                    async for item in stream:
                        if isinstance(item, Usage):
                            paid = True
                            result.usage = added(result.usage, item)
                            self.budgets.record(result.thread, item)
                            span.set(model=item.model, first_chunk_s=item.first_chunk_s)
                            continue
                        if item.__class__ is Thinking:
                            if item.fresh:
                                thought = 0
                            shown = item.text[:max(0, limit - thought)]
                            if shown:   # fresh: the first shown of the reply, or anew
                                observer.on_thinking(shown, thought == 0)
                                thought += len(shown)
                            continue
                        size += len(item)
                        if size > limit:    # more characters than bytes allowed: too long
                            raise TurnFailed(too_long(self.backend.name, limit))
                        chunks.append(item)
                        observer.on_chunk(item)
            observer.on_reply_done()
        except LLMError as error:
            raise TurnFailed(f"{error.code}: {error.message}",
                             retry_after_seconds=error.retry_after_seconds) from error
        except TimeoutError:
            raise TurnFailed(f"STREAM_TIMEOUT: the {self.backend.name} backend did not finish "
                             f"within {self.config.llm_timeout:g} s; send the message again")
        finally:
            if chunks and not paid:       # cut off (a failure, a timeout, the person)
                self._charge_cut(request, "".join(chunks), result)
        return "".join(chunks)

    def _charge_cut(self, request: PromptRequest, streamed: str, result: TurnResult) -> None:
        """Charge a reply cut off after STREAMED as estimated: else every cut stream
        would be free, and a budget no bound."""
        usage = cut_reply_usage(request, streamed, self.backend.model_for(request),
                                self.config.llm.prices)
        result.usage = added(result.usage, usage)
        self.budgets.record(result.thread, usage)

    def close(self) -> None:
        self._judges.shutdown(cancel_futures=True)


def too_long(backend: str, limit: int) -> str:
    """Why a turn stopped reading a reply that grew past LIMIT (max_reply_bytes): the
    reader would refuse it, and reading on costs time and memory without bound."""
    return (f"the {backend} backend's reply grew past max_reply_bytes ({limit} bytes) "
            "before it ended; nothing of it was kept: send the message again")
