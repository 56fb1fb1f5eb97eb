"""Signal's text styles from the bridge's HTML: the same emphasis, as plain text with ranges.

Signal shows no HTML.  A message is plain text plus `textStyle` ranges,
"START:LENGTH:STYLE", counted in UTF-16 code units, with the styles BOLD,
ITALIC, STRIKETHROUGH, MONOSPACE and SPOILER (signal-cli(1), `send
--text-style`).  `styled` reads the HTML subset that
`opencortex.bridges.render.to_html` produces (b, i, u, s, code, pre,
blockquote, a; everything else arrives escaped) and returns the text a reader
sees with its ranges.  Nothing is dropped: underline and block quotes have no
Signal style and stay plain, and a link keeps its address in parentheses after
its text when the two differ.
"""

from __future__ import annotations

from html.parser import HTMLParser

STYLES = {"b": "BOLD", "strong": "BOLD", "i": "ITALIC", "em": "ITALIC",
          "s": "STRIKETHROUGH", "del": "STRIKETHROUGH", "strike": "STRIKETHROUGH",
          "code": "MONOSPACE", "pre": "MONOSPACE"}


def utf16_length(text: str) -> int:
    """TEXT's length in UTF-16 code units (how Signal counts offsets)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class _Reader(HTMLParser):
    """Collects the text of the HTML it is fed and the style ranges over it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.length = 0                                   # UTF-16 units so far
        self.ranges: dict[tuple[int, int, str], None] = {}   # ordered, without repeats
        self._open: list[tuple[str, int, int, str]] = []  # tag, offset, part index, href

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = (dict(attrs).get("href") or "") if tag == "a" else ""
        self._open.append((tag, self.length, len(self.parts), href))

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index][0] == tag:
                break
        else:
            return                                        # a stray end tag: nothing to close
        _, start, part, href = self._open.pop(index)
        del self._open[index:]
        style = STYLES.get(tag)
        if style and self.length > start:
            self.ranges[(start, self.length - start, style)] = None
        if href and "".join(self.parts[part:]) not in (href, href.removeprefix("mailto:")):
            self.handle_data(f" ({href})")

    def handle_data(self, data: str) -> None:
        self.parts.append(data)
        self.length += utf16_length(data)


def styled(html: str) -> tuple[str, list[str]]:
    """HTML (from `to_html`) as Signal text and its "START:LENGTH:STYLE" ranges."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    ranges = [f"{start}:{length}:{style}" for start, length, style in reader.ranges]
    return "".join(reader.parts), ranges
