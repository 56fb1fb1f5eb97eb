"""Preparing a turn off the loop: recall, the skill context, the skill and its prompt.

Everything a turn needs before the model is asked is work for the CPU and the
archive, and part of it is skill code (triggers and the probabilistic phase)
whose cost the kernel does not control.  `Preparation.prepare` does all of it
in one call on a reading thread, the one recall needs anyway: the loop only
routes and streams, and a slow skill holds up its own turn, never another
conversation, and that turn for at most `prepare_timeout` seconds (then it
fails with a message saying so; the thread finishes the skill's call in the
background).  Skills see their event's own conversation and what was recalled
for it (same owner only), never the kernel itself.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass

from pydantic import ValidationError

from opencortex.config import Config
from opencortex.conversation.conversations import Conversation, Conversations
from opencortex.events import Event
from opencortex.llm import PromptRequest, ReplyAddress
from opencortex.llm.base import prompt_request
from opencortex.llm.routing import archetype_for
from opencortex.skills import Skill, SkillContext, SkillRegistry
from opencortex.telemetry import Telemetry
from opencortex.tools import ToolRegistry
from opencortex.turn import TurnFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A turn ready to ask the model: its context, the skill that answers (None when no
    skill does) and that skill's prompt, or why it could not be built."""

    ctx: SkillContext
    skill: Skill | None
    request: PromptRequest | None = None
    failure: TurnFailed | None = None


class Preparation:
    """Prepares turns for a kernel (built by it; holds no state of its own)."""

    def __init__(self, *, config: Config, skills: SkillRegistry, tools: ToolRegistry,
                 conversations: Conversations, telemetry: Telemetry):
        self.config = config
        self.skills = skills
        self.tools = tools
        self.conversations = conversations
        self.telemetry = telemetry

    async def prepare(self, event: Event, conversation: Conversation,
                      persona: str) -> Prepared:
        """EVENT's turn in CONVERSATION (whose thread's lock the caller holds), prepared
        on a reading thread; what was recalled is also left on CONVERSATION."""
        history = list(conversation.context.entries)
        seen = conversation.context.seen_ids()
        limit = self.config.prepare_timeout
        try:
            with self.telemetry.span("chat.context_render"):
                prepared = await self.conversations.read_within(
                    limit, contextvars.copy_context().run, self._prepare, event, history,
                    seen, persona)
        except TimeoutError:
            log.warning("preparing a turn of %s took over %g s", event.thread, limit)
            raise TurnFailed(f"recall and the skill's prompt took longer than {limit:g} s "
                             "(prepare_timeout); `opencortex skills --check` shows the "
                             "skills") from None
        conversation.recalled = prepared.ctx.recalled
        return prepared

    def _prepare(self, event: Event, history: list, seen, persona: str) -> Prepared:
        """`prepare`, on the reading thread."""
        with self.telemetry.span("chat.recall"):
            recalled = self.conversations.recall_for(event.thread, event.text, seen)
        chat = self.config.chat
        settings = {"buffer": chat.buffer, "allowed-buffers": list(chat.allowed_buffers),
                    "history-chars": chat.history_chars}
        ctx = SkillContext(event=event, thread=event.thread, history=history,
                           recalled=recalled, persona=persona, config=settings,
                           tools=self.tools.descriptions(),
                           skills_catalogue=self.skills.docs.catalogue())
        skill = next((s for s in self.skills.matching(ctx) if s.probabilistic), None)
        if skill is None:
            return Prepared(ctx, None)
        try:
            return Prepared(ctx, skill, request=self._prompt(skill, ctx))
        except TurnFailed as failure:
            return Prepared(ctx, skill, failure=failure)

    def _prompt(self, skill: Skill, ctx: SkillContext) -> PromptRequest:
        """SKILL's prompt for CTX, validated, with where the reply goes and its routing."""
        try:
            built = skill.probabilistic(ctx)
        except Exception as error:
            log.warning("probabilistic phase of %s failed: %s", skill.name, type(error).__name__)
            raise TurnFailed(f"skill {skill.name} failed to build a prompt "
                             f"({type(error).__name__}: {error})") from error
        try:
            request = built if isinstance(built, PromptRequest) else \
                prompt_request(built or {})
        except (ValidationError, TypeError, ValueError) as error:
            raise TurnFailed(f"skill {skill.name} built an invalid prompt request: "
                             f"{str(error).splitlines()[0]}") from None
        event = ctx.event
        address = ReplyAddress(channel=event.channel, chat_id=event.chat_id,
                               buffer=self.config.chat.buffer)
        routing = {"archetype": archetype_for(event.thread, self.config.llm),
                   "skill": skill.name, "channel": event.channel}
        return request.model_copy(update={"reply_to": address, "routing": routing})
