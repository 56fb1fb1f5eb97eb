"""The tool actuator: runs a registered tool with its checked arguments.

Each call gets a `ToolContext` built here for the event's thread: the tool
settings, the owner's memory (when a factory for it was given) and the
connected Emacs (`emacs`, set by whoever runs the EPC server; None when no
Emacs is connected).  A call is bounded by `[tools] timeout`; a tool that
raises fails with its exception's type and message, never a traceback.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from opencortex.actions import Action, ToolCall
from opencortex.actuators.base import Actuator, ActuatorError, Outcome
from opencortex.events import Event, Thread
from opencortex.excerpt import clip
from opencortex.tools import Tool, ToolRegistry
from opencortex.tools.context import EmacsView, MemoryView, ToolContext
from opencortex.tools.settings import ToolSettings

ERROR_CHARS = 500   # of a failing tool's message


class ToolActuator(Actuator):
    targets = ("tool",)

    def __init__(self, tools: ToolRegistry, settings: ToolSettings | None = None,
                 memory_for: Callable[[Thread], MemoryView] | None = None):
        self.tools = tools
        self.settings = settings or ToolSettings()
        self.memory_for = memory_for
        self.emacs: Callable[[], EmacsView | None] = lambda: None

    def context_for(self, event: Event) -> ToolContext:
        """What a tool called for EVENT sees."""
        memory = self.memory_for(event.thread) if self.memory_for else None
        return ToolContext(event=event, settings=self.settings, memory=memory,
                           emacs=self.emacs())

    def bind(self, action: Action, event: Event) -> "BoundCall":
        """ACTION's tool with its arguments checked and the context it runs in for EVENT
        (ActuatorError when the tool is gone or the arguments do not fit it)."""
        if not isinstance(action, ToolCall):
            raise ActuatorError(f"the tool actuator cannot carry out {type(action).__name__}")
        tool = self.tools.get(action.tool)
        if tool is None:
            raise ActuatorError(f"tool {action.tool!r} is not registered")
        if tool.check is not None:   # a schema-checked tool (MCP) takes the checked dict
            try:
                args = tool.check(action.args)
            except ValueError as error:
                raise ActuatorError(f"tool {action.tool!r}: bad arguments: {error}") from None
        else:
            args = tool.arguments.model_validate(
                {k.replace("-", "_"): v for k, v in action.args.items()})
        return BoundCall(tool, args, self.context_for(event), self.settings.timeout)

    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        return Outcome(result=await self.bind(action, event).run())


@dataclass(frozen=True)
class BoundCall:
    """One checked call of a tool, with its context: asked about, previewed, run."""

    tool: Tool
    args: Any
    ctx: ToolContext
    timeout: float

    def needs_approval(self) -> str | None:
        """The tool's own reason why this call must be asked about, or None."""
        if self.tool.needs_approval is None:
            return None
        try:
            reason = self.tool.needs_approval(self.args, self.ctx)
        except Exception as error:   # a broken hook asks rather than lets through
            return f"the tool's approval check failed ({type(error).__name__})"
        return str(reason) if reason else None

    async def preview(self) -> str:
        """What the call would change, in the tool's words (empty when it says nothing)."""
        if self.tool.preview is None:
            return ""
        return str(await self._bounded(self.tool.preview))

    async def run(self) -> str:
        """The tool's result."""
        return str(await self._bounded(self.tool.run))

    async def _bounded(self, function: Callable) -> Any:
        """FUNCTION(args, ctx), awaited if it returns an awaitable, within the timeout."""
        tool, limit = self.tool, self.timeout
        try:
            async with asyncio.timeout(limit):
                value = function(self.args, self.ctx)
                if inspect.isawaitable(value):
                    value = await value
                return value
        except TimeoutError:
            raise ActuatorError(f"tool {tool.name!r} did not finish within {limit:g} s") \
                from None
        except ActuatorError:
            raise
        except Exception as error:  # a tool is trusted code, but may still fail
            raise ActuatorError(f"tool {tool.name!r} failed: {type(error).__name__}: "
                                f"{clip(str(error), ERROR_CHARS)}") from error
