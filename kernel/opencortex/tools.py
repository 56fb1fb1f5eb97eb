"""Tools a model may ask for by name, each with typed arguments.

A tool call is only ever accepted when it names a registered tool and its
arguments validate against that tool's pydantic model.  Running tools is the
tool actuator's job; this module only describes and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError


class NoArguments(BaseModel):
    """For tools that take no arguments."""
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Tool:
    """A named capability with a typed argument model."""

    name: str
    description: str
    arguments: type[BaseModel]
    run: Callable[[BaseModel], str | Awaitable[str]]

    def signature(self) -> str:
        """How a model should write a call to this tool, for prompts."""
        fields = " ".join(f":{name.replace('_', '-')} <{getattr(info.annotation, '__name__', info.annotation)}>"
                          for name, info in self.arguments.model_fields.items())
        return f'(:type :REQUEST :target :tool :action :call :tool "{self.name}" :args ({fields}))'


class ToolRegistry:
    """The tools this kernel knows, by name."""

    def __init__(self, tools: list[Tool] | None = None):
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def descriptions(self) -> dict[str, str]:
        return {name: f"{tool.description} {tool.signature()}" for name, tool in self._tools.items()}

    def validate_call(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check a call; return the normalized arguments or raise ValueError."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ValueError(f"unknown tool {name!r} (registered tools: {known})")
        fields = {str(k).replace("-", "_"): v for k, v in dict(args).items()}
        try:
            checked = tool.arguments.model_validate(fields)
        except ValidationError as error:
            problems = "; ".join(
                f":{'.'.join(str(p) for p in e['loc']).replace('_', '-')} {e['msg']}"
                for e in error.errors())
            raise ValueError(f"tool {name!r}: bad arguments: {problems}") from None
        return {k.replace("_", "-"): v for k, v in checked.model_dump().items()}


def _clock(_: BaseModel) -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_tools() -> ToolRegistry:
    """The tools every kernel has."""
    return ToolRegistry([Tool("clock", "The current UTC time.", NoArguments, _clock)])
