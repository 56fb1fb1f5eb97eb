"""A reasoning model's thinking written into the reply's text, as `<think>…</think>`.

A reasoning model (Qwen3, DeepSeek-R1 …) served without a reasoning parser
(vLLM without `--reasoning-parser`, llama.cpp with `--reasoning-format none`,
older Ollama) streams its thinking as the start of the reply's own text,
between `<think>` and `</think>`.  Read as the reply, that thinking was the
text the kernel searched for the reply's form: a plist the model only
considered ("I could answer (:type :REQUEST … :text "draft")") was taken for
the reply, and the streamed preview showed the thinking as the answer.

`ThinkTags` splits such a stream: a reply that opens with `<think>` (after
white space) is thinking up to `</think>` (tags split across chunks are
found), then text; any other reply is text from its first character.  A
reply is a plist, so no reply of its own opens with `<think>`.
"""

from __future__ import annotations

from opencortex.llm.base import Thinking

OPEN, CLOSE = "<think>", "</think>"
UNDECIDED_LIMIT = 4096   # characters of leading white space held before text is assumed


class ThinkTags:
    """Feed a reply's text chunks; get back its pieces: `Thinking` and text."""

    def __init__(self) -> None:
        self.state = "start"        # start | thinking | text
        self.held = ""              # text not yet given back (undecided)

    def feed(self, text: str) -> list[str | Thinking]:
        """The pieces TEXT (the next chunk) completes."""
        if self.state == "text":
            return [text] if text else []
        self.held += text
        if self.state == "start":
            opening = self.held.lstrip()
            if len(opening) < len(OPEN) and OPEN.startswith(opening) and \
                    len(self.held) <= UNDECIDED_LIMIT:
                return []           # may still become "<think>"
            if not opening.startswith(OPEN):
                return self._text()
            self.state, self.held = "thinking", opening[len(OPEN):]
        return self._thinking()

    def close(self) -> list[str | Thinking]:
        """What is still held when the stream ended."""
        held, self.held = self.held, ""
        if not held:
            return []
        return [Thinking(held)] if self.state == "thinking" else [held]

    def _text(self) -> list[str | Thinking]:
        self.state = "text"
        held, self.held = self.held, ""
        return [held] if held else []

    def _thinking(self) -> list[str | Thinking]:
        end = self.held.find(CLOSE)
        if end >= 0:
            thought, self.held = self.held[:end], self.held[end + len(CLOSE):]
            return ([Thinking(thought)] if thought else []) + self._text()
        keep = next((n for n in range(len(CLOSE) - 1, 0, -1)
                     if self.held.endswith(CLOSE[:n])), 0)   # maybe the start of CLOSE
        thought, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return [Thinking(thought)] if thought else []
