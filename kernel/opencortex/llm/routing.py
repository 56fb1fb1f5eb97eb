"""Who is asking decides the model: observer archetype, skill and channel → model and caps.

The kernel passes `PromptRequest.routing = {"archetype": …, "skill": …, "channel": …}`;
what it leaves out is derived from the reply address (`archetype_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from opencortex.events import Thread
from opencortex.llm.settings import LLMSettings

LOCAL_CHANNELS = ("cli", "emacs")
"""Channels only the owner of this machine can type into."""


def archetype_for(thread: Thread, settings: LLMSettings) -> str:
    """The observer archetype of whoever writes in THREAD.

    `[llm.owners]` decides first ("telegram:12345", which names its topics too,
    or "telegram:*" for a whole channel); otherwise the local channels (cli,
    emacs) are the owner, "developer"; the kernel's own channel is "system";
    every bridge chat is "guest".
    """
    owners = settings.owners
    for key in (*thread.config_names, f"{thread.channel}:*"):
        if key in owners:
            return owners[key]
    if thread.channel in LOCAL_CHANNELS:
        return "developer"
    if thread.channel == "system":
        return "system"
    return "guest"


@dataclass(frozen=True)
class ModelChoice:
    """What one request is sent with."""

    model: str
    max_tokens: int
    temperature: float | None
    archetype: str


def choose_model(settings: LLMSettings, backend: str, default_model: str,
                 routing: Mapping[str, str]) -> ModelChoice:
    """The model table's answer for ROUTING on BACKEND.

    The most specific matching row wins (the first in the file among equals);
    `settings.model` (`--model`) beats every row's model but keeps its caps.
    ROUTING may name a `tier` (rows with that tier match) and a `max_tokens`
    that caps the output further (the short-answer tier of a budget).
    """
    archetype = routing.get("archetype") or "developer"
    best = None
    for row in settings.models:
        if row.matches(backend=backend, archetype=archetype, skill=routing.get("skill"),
                       channel=routing.get("channel"), tier=routing.get("tier")):
            if best is None or row.conditions > best.conditions:
                best = row
    model = settings.model or (best.model if best and best.model else None) or default_model
    max_tokens = best.max_tokens if best and best.max_tokens else settings.max_tokens
    cap = routing.get("max_tokens")
    if cap and str(cap).isdigit() and int(cap) > 0:
        max_tokens = min(max_tokens, int(cap))
    temperature = best.temperature if best and best.temperature is not None \
        else settings.temperature
    return ModelChoice(model=model, max_tokens=max_tokens, temperature=temperature,
                       archetype=archetype)


def routing_of(request_routing: Mapping[str, str], channel: str | None, chat_id: str | None,
               settings: LLMSettings) -> dict[str, str]:
    """REQUEST_ROUTING completed from the reply address where the kernel left gaps."""
    routing = {k: v for k, v in request_routing.items() if v}
    if channel and "channel" not in routing:
        routing["channel"] = channel
    if "archetype" not in routing and channel and chat_id:
        routing["archetype"] = archetype_for(Thread(channel, chat_id), settings)
    return routing
