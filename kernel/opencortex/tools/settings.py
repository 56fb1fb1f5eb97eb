"""`[tools]`: how the tool loop runs and what the bundled tools may reach."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class ToolSettings(BaseModel):
    """The tool loop's bounds and the bundled tools' reach.

    `max_steps`: tool calls one turn may make before the model must answer;
    `result_chars`: a tool result is cut to this before the model sees it;
    `timeout`: seconds one tool call may take;
    `roots`: directories the files tools may read (nothing outside, symlinks resolved);
    `readable_buffers`: Emacs buffers a tool may read without asking;
    `capture_file`: the org file `emacs-capture` files notes into;
    `notes_file`: the org file `notes-file` appends to (None: the kernel's default,
    HOME/memory/notes.org)."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=8, ge=1, le=64)
    result_chars: int = Field(default=8000, ge=200, le=1 << 20)
    timeout: float = Field(default=30.0, gt=0)
    roots: list[Path] = Field(default_factory=list)
    readable_buffers: list[str] = Field(default_factory=lambda: ["*opencortex-chat*"])
    capture_file: Path | None = None
    notes_file: Path | None = None
