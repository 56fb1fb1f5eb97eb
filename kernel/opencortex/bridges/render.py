"""Org text (what skills write) rendered to a chat platform's HTML, everything else escaped.

The subset both Telegram's and Matrix's HTML carry: headings become bold lines,
`*bold*`, `/italic/`, `_underline_`, `+strike+`, `=verbatim=` and `~code~`
become b/i/u/s/code, `#+begin_src LANG` … `#+end_src` and ``` fences become
`<pre><code>`, `#+begin_quote` becomes a blockquote, and `[[URL][text]]` a link —
only for http, https and mailto URLs; any other link is shown as text, and a
link whose text names an address has its real one written beside it.  Every
other character is HTML-escaped, and control characters are made visible
(`opencortex.untrusted.visible`), so a reply can never inject markup.

`plain` is the fallback when a platform refuses the formatting: the org text
itself, made visible, which reads fine as plain text.  `shown_text` is what a
reader sees of the formatted text (how an export of the chat keeps a reply).
"""

from __future__ import annotations

import html
import re

from opencortex.untrusted import visible

_BLOCK_OPEN = re.compile(r"^\s*(?:#\+begin_(src|example|quote|verse)\b\s*(\S*)|```\s*(\S*))\s*$",
                         re.IGNORECASE)
_BLOCK_CLOSE = {"src": r"#\+end_src", "example": r"#\+end_example", "quote": r"#\+end_quote",
                "verse": r"#\+end_verse", "fence": r"```"}
_HEADING = re.compile(r"^(\*+)\s+(.*)$")
_LINK = r"\[\[(?P<url>[^\]\s]+)\](?:\[(?P<desc>[^\]]*)\])?\]"
_EMPHASIS = r"(?P<pre>^|[\s(\"'{])(?P<mark>[*/_+=~])(?P<body>[^\s*/_+=~](?:.*?[^\s])?)(?P=mark)(?=$|[\s.,;:!?)\"'}-])"
_INLINE = re.compile(f"{_LINK}|{_EMPHASIS}")
_TAGS = {"*": "b", "/": "i", "_": "u", "+": "s", "=": "code", "~": "code"}
SAFE_SCHEMES = ("http://", "https://", "mailto:")
# Link text that names an address ("https://bank.example", "www.bank.example",
# "bank.example/login") could hide where the link goes: the address is shown beside it.
_TAG = re.compile(r"<[^>]*>")     # markup of our own: the text's "<" is escaped
_NAMES_AN_ADDRESS = re.compile(r"(?i)[a-z][a-z0-9+.-]*:/*[^\s/]|www\.|[a-z0-9-]\.[a-z]{2,}\b")


def _escape(text: str) -> str:
    return html.escape(visible(text), quote=False)


def _inline(line: str) -> str:
    """One line of prose: emphasis and links as HTML, the rest escaped."""
    out, last = [], 0
    for match in _INLINE.finditer(line):
        out.append(_escape(line[last:match.start()]))
        last = match.end()
        if match.group("url") is not None:
            out.append(_link(match.group("url"), match.group("desc")))
            continue
        tag = _TAGS[match.group("mark")]
        body = match.group("body")
        inner = _escape(body) if tag == "code" else _inline(body)
        out.append(f"{_escape(match.group('pre'))}<{tag}>{inner}</{tag}>")
    out.append(_escape(line[last:]))
    return "".join(out)


def _link(url: str, desc: str | None) -> str:
    shown = _inline(desc) if desc else _escape(url)
    if url.lower().startswith(SAFE_SCHEMES):
        link = f'<a href="{html.escape(visible(url), quote=True)}">{shown}</a>'
        if desc and desc.strip() != url and _NAMES_AN_ADDRESS.search(desc):
            link += f" ({_escape(url)})"
        return link
    return shown if desc else _escape(f"[[{url}]]")


def _unescape_org(line: str) -> str:
    """Undo org's comma escape of lines that would read as structure."""
    return line[1:] if re.match(r"^\s*,(\*|#\+|,)", line) else line


def to_html(text: str) -> str:
    """TEXT (org) as platform HTML: b, i, u, s, code, pre, blockquote, a."""
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        line = lines[index]
        opened = _BLOCK_OPEN.match(line)
        if opened:
            kind = (opened.group(1) or "fence").lower()
            language = opened.group(2) or opened.group(3) or ""
            body, index = _block_body(lines, index + 1, _BLOCK_CLOSE[kind])
            out.append(_block(kind, language, body))
            continue
        heading = _HEADING.match(line)
        out.append(f"<b>{_inline(heading.group(2))}</b>" if heading
                   else _inline(_unescape_org(line)))
        index += 1
    return "\n".join(out)


def _block_body(lines: list[str], start: int, closer: str) -> tuple[list[str], int]:
    """The lines of a block from START to its closing line; the index after it."""
    end = start
    pattern = re.compile(rf"^\s*{closer}\s*$", re.IGNORECASE)
    while end < len(lines) and not pattern.match(lines[end]):
        end += 1
    return [_unescape_org(line) for line in lines[start:end]], end + 1


def _block(kind: str, language: str, body: list[str]) -> str:
    escaped = _escape("\n".join(body))
    if kind == "quote":
        return f"<blockquote>{escaped}</blockquote>"
    if kind in ("src", "fence") and re.fullmatch(r"[\w+#.-]{1,32}", language):
        return f'<pre><code class="language-{language}">{escaped}</code></pre>'
    return f"<pre>{escaped}</pre>"


def shown_text(text: str) -> str:
    """What a person reads of TEXT sent formatted (`to_html`), as a chat export keeps
    it: the characters without the markup."""
    return html.unescape(_TAG.sub("", to_html(text)))


def plain(text: str) -> str:
    """TEXT for a platform that shows no formatting: org as it is, made visible."""
    return visible(text)
