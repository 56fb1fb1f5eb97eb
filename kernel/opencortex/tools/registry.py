"""Tools a model may ask for by name, each with typed arguments and a risk class.

A tool call is only ever accepted when it names a registered tool and its
arguments validate against that tool's pydantic model (or, for a tool of an
MCP server, its JSON schema).  Running tools is the tool actuator's job and
deciding whether a call may run is the approval policy's
(`opencortex.policy`); this module only describes and checks them.

Tools come in groups ("kernel" for the built-in ones, "skills" for the
`deftool`s of the skill files, "mcp:NAME" per MCP server); a reload
replaces one group whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
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


Risk = Literal["read-only", "writes", "external"]
"""What running a tool can do: only read, change local state, or reach outside."""
RISKS: tuple[str, ...] = get_args(Risk)
Trust = Literal["kernel", "trusted", "untrusted"]
"""Whose code a tool is: the kernel's or a skill file's, or a (trusted or untrusted) MCP server's."""

Runner = Callable[[BaseModel, Any], "str | Awaitable[str]"]


class NoArguments(BaseModel):
    """For tools that take no arguments."""
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Tool:
    """A named capability with a typed argument model.

    `run(arguments, ctx)` does the work (ctx: `opencortex.tools.context.ToolContext`);
    `preview(arguments, ctx)`, when given, says what the call would change (a diff),
    for the person asked to approve it; `needs_approval(arguments, ctx)`, when given,
    returns a reason when this call must be approved although its risk would not ask.
    `check(args)`, when given, validates a call's arguments instead of the pydantic model and returns them normalized (raising
    ValueError with the reasons) — `run` then gets that dict, not a model — and
    `call_form` shows the arguments in prompts."""

    name: str
    description: str
    arguments: type[BaseModel]
    run: Runner
    risk: Risk = "read-only"
    trust: Trust = "kernel"
    preview: Callable[[BaseModel, Any], "str | Awaitable[str]"] | None = None
    needs_approval: Callable[[BaseModel, Any], "str | None"] | None = None
    check: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    call_form: str | None = None
    source: Path | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        if self.risk not in RISKS:
            raise ValueError(f"tool {self.name!r}: risk must be one of {', '.join(RISKS)}, "
                             f"not {self.risk!r}")

    def argument_names(self) -> frozenset[str]:
        """The names (and aliases) the argument model accepts."""
        fields = self.arguments.model_fields
        return frozenset(fields) | {info.alias for info in fields.values() if info.alias}

    def signature(self) -> str:
        """The exact form a model writes to call this tool, for prompts: no :args
        for a tool without arguments, else each argument with a <type> placeholder
        (optional ones after the required ones)."""
        call = f'(:type :REQUEST :target :tool :action :call :tool "{self.name}"'
        if self.call_form is not None:
            return f"{call} :args ({self.call_form}))" if self.call_form else call + ")"
        fields = sorted(self.arguments.model_fields.items(),
                        key=lambda item: not item[1].is_required())
        if not fields:
            return call + ")"
        shown = " ".join(f":{name.replace('_', '-')} <{_placeholder(info)}>"
                         for name, info in fields)
        return f"{call} :args ({shown}))"


class ToolRegistry:
    """The tools this kernel knows, by name, in groups that are replaced whole."""

    def __init__(self, tools: list[Tool] | None = None):
        self._tools: dict[str, Tool] = {}
        self._groups: dict[str, list[str]] = {}
        self._descriptions: dict[str, str] | None = None   # built once per change
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool, group: str = "kernel") -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._groups.setdefault(group, []).append(tool.name)
        self._descriptions = None

    def replace(self, group: str, tools: list[Tool]) -> list[Tool]:
        """Make TOOLS the whole of GROUP; return those left out because another group
        already has a tool of that name."""
        for name in self._groups.pop(group, []):
            self._tools.pop(name, None)
        self._descriptions = None
        left_out = []
        for tool in tools:
            if tool.name in self._tools:
                left_out.append(tool)
                continue
            self.register(tool, group)
        return left_out

    def group_of(self, name: str) -> str | None:
        """The group the tool NAME belongs to."""
        return next((group for group, names in self._groups.items() if name in names), None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def all(self) -> list[Tool]:
        """Every registered tool, by name."""
        return [self._tools[name] for name in sorted(self._tools)]

    def descriptions(self) -> dict[str, str]:
        """Each tool's description and exact call form, for prompts (a copy)."""
        if self._descriptions is None:
            self._descriptions = {name: f"{tool.description} {tool.signature()}"
                                  for name, tool in self._tools.items()}
        return dict(self._descriptions)

    def validate_call(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check a call; return the normalized arguments or raise ValueError."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ValueError(f"unknown tool {excerpt(name, 60)} (registered tools: {known})")
        if tool.check is not None:
            try:
                return tool.check(args)
            except ValueError as error:
                raise ValueError(f"tool {name!r}: bad arguments: {error}") from None
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
    if base is Literal and all(isinstance(v, str) for v in get_args(choices[0])):
        name = "one of " + " ".join(f'"{v}"' for v in get_args(choices[0]))
    return name if info.is_required() else f"{name}, optional"


def _clock(_: BaseModel, ctx: Any = None) -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_tools() -> ToolRegistry:
    """The tools every kernel has."""
    return ToolRegistry([Tool("clock", "The current UTC time.", NoArguments, _clock)])
