"""One approval policy for every action: `[approvals]` says allow, ask or deny.

What is ruled on: every tool call (by tool name; `prefix/*` and other shell-style
patterns match MCP tools such as `github/*`), shell commands (`shell`), and
messages to another conversation (`cross-post`).  Rules may be set for all
channels, per channel (`[approvals.channels.telegram]`) and per archetype
(`[approvals.archetypes.guest]`):

- a `deny` at any level wins, so a channel or archetype can only be made
  stricter than a deny above it;
- otherwise the most specific level that names the subject decides
  (archetype over channel over all), an exact tool name over a pattern;
- otherwise the default: read-only tools allow, tools that change state or
  reach outside ask, shell and cross-posts ask, unknown tools deny.

Then the kernel's floor, which no configuration lifts: shell and cross-posts
never run without a person's yes (only `ask` or `deny` may be configured);
tools of an untrusted MCP server always ask; a channel that cannot ask a person
(or a guest's message) turns every ask into a deny.  The model never approves
and never changes policy: nothing here reads the model's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:   # config imports this module before the kernel needs tools
    from opencortex.tools import Tool

Decision = Literal["allow", "ask", "deny"]
Floor = Literal["ask", "deny"]   # shell and cross-posts: a person always decides


class PolicyRules(BaseModel):
    """Rules of one level: per tool name or pattern, shell, cross-post."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              alias_generator=lambda name: name.replace("_", "-"))

    tools: dict[str, Decision] = Field(default_factory=dict)
    shell: Floor | None = None
    cross_post: Floor | None = None


class ApprovalSettings(PolicyRules):
    """`[approvals]`: rules for all channels, then per channel and per archetype."""

    channels: dict[str, PolicyRules] = Field(default_factory=dict)
    archetypes: dict[str, PolicyRules] = Field(default_factory=dict)


@dataclass(frozen=True)
class Ruling:
    """What the policy decided and why, in words a person can check against the config."""

    decision: Decision
    reason: str


class ApprovalPolicy:
    """Rules on tool calls, shell commands and cross-posts for one channel and archetype."""

    def __init__(self, settings: ApprovalSettings | None = None):
        self.settings = settings or ApprovalSettings()

    def _levels(self, channel: str, archetype: str) -> list[tuple[str, PolicyRules]]:
        """The levels that apply, least specific first, with their config names."""
        levels = [("[approvals]", self.settings)]
        if channel in self.settings.channels:
            levels.append((f"[approvals.channels.{channel}]", self.settings.channels[channel]))
        if archetype in self.settings.archetypes:
            levels.append((f"[approvals.archetypes.{archetype}]",
                           self.settings.archetypes[archetype]))
        return levels

    def for_tool(self, tool: "Tool | None", name: str, *, channel: str,
                 archetype: str) -> Ruling:
        """The ruling on calling tool NAME (TOOL is None when no such tool exists)."""
        if tool is None:
            return Ruling("deny", f"no tool {name!r} is registered")
        found = []
        for label, rules in self._levels(channel, archetype):
            match = _tool_rule(rules.tools, name)
            if match is not None:
                pattern, decision = match
                found.append(Ruling(decision, f"{label} tools.{pattern} = {decision}"))
        ruling = _decide(found) or _default(tool)
        if ruling.decision == "allow" and tool.trust == "untrusted":
            return Ruling("ask", f"tools of an untrusted MCP server always ask ({ruling.reason})")
        return ruling

    def for_shell(self, *, channel: str, archetype: str) -> Ruling:
        return self._floor("shell", channel, archetype)

    def for_cross_post(self, *, channel: str, archetype: str) -> Ruling:
        return self._floor("cross_post", channel, archetype)

    def _floor(self, subject: str, channel: str, archetype: str) -> Ruling:
        key = subject.replace("_", "-")
        found = [Ruling(value, f"{label} {key} = {value}")
                 for label, rules in self._levels(channel, archetype)
                 if (value := getattr(rules, subject)) is not None]
        return _decide(found) or Ruling("ask", f"{key} always asks by default")


def _tool_rule(rules: dict[str, Decision], name: str) -> tuple[str, Decision] | None:
    """The rule of RULES for tool NAME: its exact name, else the longest matching pattern."""
    if name in rules:
        return name, rules[name]
    patterns = [p for p in rules if any(c in p for c in "*?[") and fnmatchcase(name, p)]
    if not patterns:
        return None
    best = max(patterns, key=len)
    return best, rules[best]


def _decide(found: list[Ruling]) -> Ruling | None:
    """A deny anywhere wins; else the most specific (last) ruling; None if none."""
    return next((r for r in found if r.decision == "deny"), None) or \
        (found[-1] if found else None)


def _default(tool: "Tool") -> Ruling:
    if tool.risk == "read-only":
        return Ruling("allow", "read-only tools are allowed by default")
    return Ruling("ask", f"tools that {'change state' if tool.risk == 'writes' else 'reach outside'}"
                         " ask by default")
