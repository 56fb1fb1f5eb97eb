"""What a running tool sees: its turn's event, the tool settings, and the kernel's
services a tool may use, each already scoped to the event's owner.

A tool never reaches into the kernel: memory and Emacs come as the narrow views
below, built per call by the tool actuator.  `emacs` is None when no Emacs is
connected; an Emacs tool says so instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from opencortex.events import Event, Thread
from opencortex.tools.settings import ToolSettings


class MemoryView(Protocol):
    """The archive as one owner may see it (never another owner's messages)."""

    def search(self, query: str, limit: int = 5) -> list[dict[str, Any]]:
        """Messages of the owner matching QUERY, best first."""

    def messages(self, since: float | None = None, until: float | None = None,
                 limit: int = 50) -> list[dict[str, Any]]:
        """The event's thread's messages between two Unix times, oldest first."""


class EmacsView(Protocol):
    """The connected Emacs, called only through the methods it defines for tools."""

    async def call(self, method: str, *args: Any) -> Any:
        """Call METHOD in Emacs and return its answer; ActuatorError if it fails."""


@dataclass(frozen=True)
class ToolContext:
    """Given to every tool call: `event`, `settings`, `memory`, `emacs` (or None)."""

    event: Event
    settings: ToolSettings
    memory: MemoryView | None = None
    emacs: EmacsView | None = None

    @property
    def thread(self) -> Thread:
        return self.event.thread

    @property
    def channel(self) -> str:
        return self.event.channel
