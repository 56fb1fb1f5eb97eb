"""A backend that replays canned replies from a file, in order (for tests and demos).

File formats:
- `*.jsonl`: one reply a line, either a JSON string or an object
  `{"text": "...", "chunks": ["..", ".."], "delay": 0.05, "error": "LLM_UNAVAILABLE",
  "thinking": ["..", ".."]}` (`chunks` streams exactly those pieces, `delay`
  seconds before each; `error` makes that turn fail; `thinking`, a reasoning
  model's thoughts, streams first).
- anything else: replies separated by lines holding only `%%`.
When the replies run out the backend fails with LLM_UNAVAILABLE, saying so.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator

from opencortex.llm.base import (Backend, LLMError, PromptRequest, Thinking, Usage,
                                 estimate_tokens)
from opencortex.llm.echo import split_chunks


def _entry(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, str):
        return {"text": raw}
    if isinstance(raw, dict) and ("text" in raw or "chunks" in raw or "error" in raw):
        return raw
    raise ValueError(f"{where}: expected a string or an object with text, chunks or error")


def load_script(path: Path) -> list[dict[str, Any]]:
    """Read the replies of a script file, or raise ValueError naming the line."""
    try:
        content = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"script {path}: cannot be read: {error.strerror}") from None
    if path.suffix == ".jsonl":
        entries = []
        for number, line in enumerate(content.splitlines(), 1):
            if line.strip():
                try:
                    entries.append(_entry(json.loads(line), f"{path}:{number}"))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from None
        return entries
    blocks, current = [], []
    for line in content.split("\n"):
        if line.rstrip("\r") == "%%":
            blocks.append("\n".join(current))
            current = []
        else:
            current.append(line)
    blocks.append("\n".join(current))
    return [{"text": b.strip("\n")} for b in blocks if b.strip()]


class ScriptBackend(Backend):
    """Replays the replies of a script file, one per request."""

    name = "script"

    def __init__(self, path: Path, chunk_size: int = 16, delay: float = 0.0):
        self.path = path
        self.replies = load_script(path)
        self.position = 0
        self.chunk_size = chunk_size
        self.delay = delay

    async def stream(self, request: PromptRequest) -> AsyncIterator[str | Thinking | Usage]:
        started = time.perf_counter()
        if self.position >= len(self.replies):
            raise LLMError("LLM_UNAVAILABLE",
                           f"the script {self.path.name} has no replies left "
                           f"(it had {len(self.replies)})")
        entry = self.replies[self.position]
        self.position += 1
        if entry.get("error"):
            raise LLMError(entry["error"], entry.get("message", "scripted failure"),
                           retry_after_seconds=entry.get("retry_after"))
        chunks = entry.get("chunks") or split_chunks(entry.get("text", ""), self.chunk_size)
        delay = float(entry.get("delay", self.delay))
        for number, thought in enumerate(entry.get("thinking") or ()):
            if delay:
                await asyncio.sleep(delay)
            yield Thinking(str(thought), fresh=number == 0)
        for chunk in chunks:
            if delay:
                await asyncio.sleep(delay)
            yield chunk
        reply = "".join(chunks)
        prompt = request.system + "".join(m.content for m in request.messages)
        yield Usage(input_tokens=estimate_tokens(prompt), output_tokens=estimate_tokens(reply),
                    model=f"script:{self.path.name}",
                    latency_s=time.perf_counter() - started, cost_usd=0.0, estimated=True)
