"""Model text is untrusted wherever it is shown: how it is made harmless per surface.

A model (or a stranger on a bridge) can write any character.  Three rules:

- `visible(text)`: control characters never reach a terminal or an editor as
  controls.  C0 controls other than newline and tab, DEL, C1 controls and the
  bidirectional overrides are replaced by visible stand-ins: ESC becomes ``␛``
  (so ``ESC ] 0 ;`` shows as ``␛]0;`` and retitles nothing), CR becomes ``␍``
  (so a line cannot be overwritten), C1 and bidi controls become ``⟨U+009B⟩``.
  Printable text, including every script and emoji, is unchanged.
- `model_note(text)`: model text shown *inside* something the kernel builds (an
  approval block, a "Why:" line) is one line, length-capped, visible, and
  cannot open org structure: no newline (so no heading, drawer or second
  block), link brackets ``[[``/``]]`` split apart.  Frontends show it as a
  quoted field marked as the model's words.
- Lone surrogates (undecodable bytes) are shown as U+FFFD, so printing never
  raises.

The org archive keeps the exact text (escaped there by `memory.orgformat`);
these functions are for display only.
"""

from __future__ import annotations

import re

NOTE_LIMIT = 200  # characters of model text shown inside a kernel-built block

# C0 except \t and \n, DEL, C1, bidi embeddings/overrides/isolates, lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_BLANKS = re.compile(r"[ \t\n]+")


def _stand_in(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)           # ␀ … ␟ (control pictures)
    if code == 0x7F:
        return "\u2421"                      # ␡
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"\u27e8U+{code:04X}\u27e9"       # ⟨U+009B⟩


def visible(text: str) -> str:
    """TEXT with every control character (but newline and tab) made visible."""
    return _UNSAFE.sub(_stand_in, text)


def has_controls(text: str) -> bool:
    """Whether `visible` would change TEXT."""
    return _UNSAFE.search(text) is not None


def model_note(text: str | None, limit: int = NOTE_LIMIT) -> str:
    """TEXT as one visible line of at most LIMIT characters that opens no org structure."""
    if not text:
        return ""
    line = _BLANKS.sub(" ", visible(text)).strip()
    line = line.replace("[[", "[ [").replace("]]", "] ]")
    if len(line) > limit:
        line = line[:limit - 1].rstrip() + "…"
    return line
