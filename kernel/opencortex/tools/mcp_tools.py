"""An MCP server's listed tools as registry Tools, and its results as text.

Everything here comes from the server and is untrusted: names are checked,
descriptions made one visible capped line, results joined, summarised
(images, audio, binary resources by size) and capped.  Risk comes from the
tool's annotations: `readOnlyHint` → read-only; `openWorldHint` (and not
read-only) → external; anything else, hints missing included → writes.
"""

from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable, Mapping

from pydantic import BaseModel, ConfigDict

from opencortex.excerpt import clip
from opencortex.tools.mcp_schema import ArgumentChecker
from opencortex.tools.registry import Risk, Tool, Trust
from opencortex.untrusted import model_note, visible

TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_DESCRIPTION = 600
MAX_ERROR = 500
MAX_BLOCKS = 1000

Call = Callable[[str, dict[str, Any]], Awaitable[str]]


class McpArguments(BaseModel):
    """An MCP tool's arguments, already checked against its JSON schema by `check`."""
    model_config = ConfigDict(extra="allow")


def risk_of(annotations: Any) -> Risk:
    """The risk class the tool's annotations claim."""
    if annotations is not None and getattr(annotations, "read_only_hint", None) is True:
        return "read-only"
    if annotations is not None and getattr(annotations, "open_world_hint", None) is True:
        return "external"
    return "writes"


def description_of(listed: Any, server: str) -> str:
    """The listed tool's description (or title) as one visible, capped line."""
    text = listed.description or listed.title or ""
    return model_note(text, MAX_DESCRIPTION) or f"Tool {listed.name} of MCP server {server}."


def build_tool(server: str, listed: Any, trust: Trust, call: Call) -> Tool:
    """The registry Tool `SERVER/NAME` for LISTED; ValueError when it cannot be offered."""
    if not isinstance(listed.name, str) or not TOOL_NAME.fullmatch(listed.name):
        raise ValueError(f"tool name {clip(visible(str(listed.name)), 40)!r} is not "
                         "letters, digits, _ - and . (at most 128)")
    checker = ArgumentChecker(listed.input_schema)
    remote = listed.name

    async def run(arguments: Any, ctx: Any = None) -> str:
        if isinstance(arguments, BaseModel):
            arguments = arguments.model_dump()
        elif not isinstance(arguments, Mapping):
            arguments = {}
        return await call(remote, checker.check(arguments))

    return Tool(name=f"{server}/{remote}", description=description_of(listed, server),
                arguments=McpArguments, run=run, risk=risk_of(listed.annotations),
                trust=trust, check=checker.check, call_form=checker.call_form())


def _size(data: str) -> str:
    """The size of base64 DATA, decoded, in KB."""
    kilobytes = len(data) * 3 / 4 / 1024
    return f"{kilobytes:.0f} KB" if kilobytes >= 1 else f"{len(data) * 3 // 4} bytes"


def block_text(block: Any) -> str:
    """One content block as text: text as it is, other kinds summarised."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}, {_size(block.data)}]"
    if kind == "resource_link":
        return f"[resource link {clip(block.uri, 200)}]"
    if kind == "resource":
        resource = block.resource
        if getattr(resource, "text", None) is not None:
            return f"[resource {clip(resource.uri, 200)}]\n{resource.text}"
        return f"[resource {clip(resource.uri, 200)}, {_size(getattr(resource, 'blob', ''))}]"
    return f"[{clip(str(kind), 40)} content]"


def result_text(result: Any, limit: int) -> str:
    """A tool result's content as visible text of at most LIMIT characters."""
    pieces: list[str] = []
    used = 0
    for block in list(result.content or [])[:MAX_BLOCKS]:
        piece = block_text(block)
        pieces.append(piece[:limit + 1])
        used += len(pieces[-1]) + 1
        if used > limit:
            break
    if not pieces and result.structured_content is not None:
        pieces.append(json.dumps(result.structured_content, ensure_ascii=False)[:limit + 1])
    text = visible("\n".join(pieces))
    if len(text) <= limit:
        return text
    note = f"\n… [result cut to {limit} characters]"
    return text[:max(0, limit - len(note))] + note


def error_text(result: Any) -> str:
    """An error result's text, one visible capped line."""
    return model_note(result_text(result, MAX_ERROR * 2), MAX_ERROR) or "the tool failed"
