"""The words of a reply while it streams: the `:text` value, decoded as it arrives.

A model streams a plist such as `(:type :REQUEST … :text "Hello \\"you\\"")`.  To
show the words as they come, `TextExtractor` scans the chunks once, outside
strings looks for the `:text` key, then decodes that string's characters until
its closing quote.  This is a preview only: the verified reply replaces it.
"""

from __future__ import annotations

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", '"': '"', "\\": "\\"}
DELIMITERS = frozenset(" \t\r\n()[]\"")


class TextExtractor:
    """Feed chunks; get back the newly streamed part of the `:text` value."""

    def __init__(self, key: str = ":text"):
        self.key = key
        self.state = "outside"  # outside | string | after-key | text | done
        self.atom: list[str] = []
        self.escaped = False

    def feed(self, chunk: str) -> str:
        """Consume CHUNK; return the text characters it completed."""
        out: list[str] = []
        for char in chunk:
            if self.state == "done":
                break
            self._step(char, out)
        return "".join(out)

    def _step(self, char: str, out: list[str]) -> None:
        if self.state in ("string", "text"):
            self._in_string(char, out)
        elif self.state == "after-key":
            if char == '"':
                self.state = "text"
            elif not char.isspace():
                self.state = "outside"
                self._outside(char)
        else:
            self._outside(char)

    def _outside(self, char: str) -> None:
        if char not in DELIMITERS:
            self.atom.append(char)
            return
        was_key = "".join(self.atom).lower() == self.key
        self.atom.clear()
        if was_key:
            self.state = "text" if char == '"' else "after-key"
        elif char == '"':
            self.state = "string"

    def _in_string(self, char: str, out: list[str]) -> None:
        in_text = self.state == "text"
        if self.escaped:
            self.escaped = False
            if in_text:
                out.append(ESCAPES.get(char, "\\" + char))
        elif char == "\\":
            self.escaped = True
        elif char == '"':
            self.state = "done" if in_text else "outside"
        elif in_text:
            out.append(char)
