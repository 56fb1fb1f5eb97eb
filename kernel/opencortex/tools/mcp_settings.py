"""`[mcp.servers.NAME]`: the MCP servers whose tools the model may call.

    [mcp.servers.notes]
    command = ["notes-mcp", "--db", "/home/me/notes.db"]
    env = ["PATH", "HOME", "NOTES_TOKEN", "LOG_LEVEL=info"]
    trust = "trusted"
    timeout = 20
    max_result_chars = 8000

`command`: the program and its arguments (no shell; the program is looked up
on the kernel's PATH).  `env`: exactly what the server's environment holds,
as in `docker run -e`: `NAME` copies the kernel's variable (left out when the
kernel has none), `NAME=value` sets a fixed value.  Nothing else of the
kernel's environment reaches the server (no provider keys); the default is
PATH, HOME and LANG, and a list you write replaces it.  `trust`: "untrusted"
(the default: every call is approved by a person) or "trusted" (its
read-only tools may run without asking, as the approval policy says).
`cwd`: the server's working directory.  `timeout`: seconds one call may take;
`start_timeout`: seconds to start, initialize and list tools;
`max_result_chars`: a result is cut to this.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
ENV_ENTRY = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,127})(=.*)?", re.DOTALL)
DEFAULT_ENV = ("PATH", "HOME", "LANG")


class McpServerSettings(BaseModel):
    """One MCP server run over stdio: its command, environment, trust and bounds."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(min_length=1, max_length=256)
    env: list[str] = Field(default_factory=lambda: list(DEFAULT_ENV), max_length=256)
    trust: Literal["trusted", "untrusted"] = "untrusted"
    cwd: Path | None = None
    timeout: float = Field(default=30.0, gt=0, le=3600)
    start_timeout: float = Field(default=20.0, gt=0, le=600)
    max_result_chars: int = Field(default=8000, ge=100, le=1 << 20)
    # one message (a line) from the server, at most; over it the server is restarted
    max_message_bytes: int = Field(default=16 << 20, ge=1 << 16, le=1 << 30)

    @field_validator("command")
    @classmethod
    def _plain_words(cls, command: list[str]) -> list[str]:
        if not command[0].strip():
            raise ValueError("the first word of command must name a program")
        if any("\0" in word for word in command):
            raise ValueError("command words cannot hold a NUL character")
        return command

    @field_validator("env")
    @classmethod
    def _entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not ENV_ENTRY.fullmatch(entry) or "\0" in entry:
                raise ValueError(f"env entries are NAME or NAME=value, not {entry[:40]!r}")
        return entries

    def environment(self, kernel_env: dict[str, str]) -> dict[str, str]:
        """The server's whole environment, from `env` and the kernel's KERNEL_ENV."""
        chosen: dict[str, str] = {}
        for entry in self.env:
            name, sep, value = entry.partition("=")
            if sep:
                chosen[name] = value
            elif name in kernel_env:
                chosen[name] = kernel_env[name]
        return chosen


class McpSettings(BaseModel):
    """The `[mcp]` table: `servers`, by name (letters, digits, - and _)."""

    model_config = ConfigDict(extra="forbid")

    servers: dict[str, McpServerSettings] = Field(default_factory=dict, max_length=64)

    @field_validator("servers")
    @classmethod
    def _names(cls, servers: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for name in servers:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(f"server name {name[:40]!r} must be 1-32 letters, digits, "
                                 "- or _ (it prefixes the tool names: NAME/tool)")
        return servers
