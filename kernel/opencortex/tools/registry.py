"""Tools a model may ask for by name, each with typed arguments.

A tool call is only ever accepted when it names a registered tool and its
arguments validate against that tool's pydantic model.  Running tools is the
tool actuator's job; this module only describes and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from types import UnionType
from typing import Any, Awaitable, Callable, Literal, Mapping, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from opencortex.excerpt import clip, excerpt
from opencortex.plain_errors import MAX_REASONS, plain_reasons

MAX_PROBLEMS = MAX_REASONS + 1  # sentences, and the count of the rest

# How an argument's type is shown in a tool's call form.
_PLACEHOLDERS: dict[Any, str] = {str: "string", int: "integer", float: "number",
                                  bool: "t-or-nil", list: "list", dict: "plist",
                                  Literal: "choice"}


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

    def argument_names(self) -> frozenset[str]:
        """The names (and aliases) the argument model accepts."""
        fields = self.arguments.model_fields
        return frozenset(fields) | {info.alias for info in fields.values() if info.alias}

    def signature(self) -> str:
        """The exact form a model writes to call this tool, for prompts: no :args
        for a tool without arguments, else each argument with a <type> placeholder
        (optional ones after the required ones)."""
        call = f'(:type :REQUEST :target :tool :action :call :tool "{self.name}"'
        fields = sorted(self.arguments.model_fields.items(),
                        key=lambda item: not item[1].is_required())
        if not fields:
            return call + ")"
        shown = " ".join(f":{name.replace('_', '-')} <{_placeholder(info)}>"
                         for name, info in fields)
        return f"{call} :args ({shown}))"


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
            raise ValueError(f"unknown tool {excerpt(name, 60)} (registered tools: {known})")
        fields = {str(k).replace("-", "_"): v for k, v in dict(args).items()}
        unknown = f"is not an argument of tool {name!r}"
        problems = [f":{clip(key, 40).replace('_', '-')} {unknown}"
                    for key in fields if key not in tool.argument_names()]
        try:
            checked = tool.arguments.model_validate(fields)
        except ValidationError as error:
            problems += plain_reasons(error, unknown=unknown, keyword_choices=False)
        if problems:
            shown = "; ".join(dict.fromkeys(problems[:MAX_PROBLEMS]))
            raise ValueError(f"tool {name!r}: bad arguments: {shown}")
        return {k.replace("_", "-"): v for k, v in checked.model_dump().items()}


def _placeholder(info: FieldInfo) -> str:
    """A short name for an argument's type: <string>, <integer>, ..., optional marked."""
    annotation: Any = info.annotation
    choices = [arg for arg in get_args(annotation) if arg is not type(None)] \
        if get_origin(annotation) in (Union, UnionType) else [annotation]
    base = get_origin(choices[0]) or choices[0] if len(choices) == 1 else None
    name = _PLACEHOLDERS.get(base) or getattr(base, "__name__", None) or "value"
    return name if info.is_required() else f"{name}, optional"


def _clock(_: BaseModel) -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_tools() -> ToolRegistry:
    """The tools every kernel has."""
    return ToolRegistry([Tool("clock", "The current UTC time.", NoArguments, _clock)])
