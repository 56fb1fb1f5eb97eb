"""What the terminal chat shows: streamed replies, the thinking indicator, notices, status.

A turn's reply streams while it arrives (the `:text` of the model's plist, see
`opencortex.streaming`), after a dim "thinking…" that goes with the first
word; a reasoning model's own thinking, when it streams one, takes the
indicator's place, dim, and the reply starts on a line of its own after it
(`[chat] show_thinking = false`: only the indicator).  That preview is not the
reply: the kernel reads and verifies the model's
form, and its terminal actuator then hands what it accepted to
`TerminalOutput.deliver` (the `writer` of `build_kernel`).  When that is what
was streamed, the line is only finished; otherwise the preview is marked as not
kept and the delivered text follows.  So the person never reads a reply twice,
and never takes a rejected preview for an answer.

Every piece of model text goes through `opencortex.untrusted.visible` here,
whatever the actuator did before: an escape sequence in a reply is shown,
never obeyed by the terminal.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, TextIO

from opencortex.streaming import TextExtractor
from opencortex.turn import TurnObserver
from opencortex.untrusted import visible

ERASE_LINE = "\r\x1b[K"   # back to column 0, clear to the end of the line
DIM, UNDIM = "\x1b[2m", "\x1b[22m"
THINKING = "thinking…"
RETRYING = "(that reply was not accepted; the model is asked again)"
NOT_KEPT = "(the streamed text above was not kept; the answer is:)"
ABANDONED = "(the streamed text above was not kept)"


class TerminalOutput:
    """Everything the chat writes, so it knows where the cursor is.

    LIVE: a person watches a terminal (previews, the thinking indicator and dim
    notices are shown); otherwise replies are printed as plain lines.  Replies go
    to OUT, the chat's own notices to ERR (the same terminal when live)."""

    def __init__(self, out: TextIO, err: TextIO, *, live: bool, color: bool,
                 thoughts: bool = True):
        self.out = out
        self.err = err
        self.live = live
        self.color = color
        self.thoughts = live and thoughts   # a reasoning model's thinking is shown
        self.view: ReplyView | None = None
        self.above_prompt: Callable[[Callable[[], None]], None] | None = None
        self._at_line_start = True
        self._thinking = False

    # -- writing ------------------------------------------------------------

    def _write(self, stream: TextIO, text: str) -> None:
        """Write TEXT (already safe to show) where the cursor is, above a running prompt."""
        if not text:
            return
        if self.above_prompt is not None:
            self.above_prompt(partial(self._write_now, stream, text))
        else:
            self._write_now(stream, text)

    def _write_now(self, stream: TextIO, text: str) -> None:
        self._hide_thinking()
        stream.write(text)
        stream.flush()
        self._at_line_start = text.endswith("\n")

    def _dim(self, text: str) -> str:
        """TEXT faint, when colours are on (not with NO_COLOR, never when piped)."""
        return f"{DIM}{text}{UNDIM}" if self.color else text

    def finish_line(self) -> None:
        """End the current line unless the cursor is already at the start of one."""
        self._hide_thinking()
        if not self._at_line_start:
            self._write(self.out, "\n")

    def text(self, text: str) -> None:
        """Model text, continuing the current line."""
        self._write(self.out, visible(text))

    def thought(self, text: str) -> None:
        """A model's thinking, dim, continuing the current line."""
        self._write(self.out, self._dim(visible(text)))

    def block(self, text: str) -> None:
        """Text for the person on lines of its own (made visible: it may quote the model)."""
        self.finish_line()
        text = visible(text)
        self._write(self.out, text if text.endswith("\n") else text + "\n")

    def notice(self, text: str) -> None:
        """One of the chat's own lines (dim when live), on stderr."""
        self.finish_line()
        self._write(self.err, self._dim(visible(text)) + "\n")

    # -- the thinking indicator ---------------------------------------------

    def show_thinking(self) -> None:
        """A dim "thinking…" on a line of its own, until anything else is written."""
        if self.live and not self._thinking:
            self.finish_line()
            self._write(self.out, self._dim(THINKING))
            self._thinking = True

    def _hide_thinking(self) -> None:
        """Erase the indicator's line, if it is shown."""
        if self._thinking:
            self._thinking = False
            self.out.write(ERASE_LINE)
            self.out.flush()
            self._at_line_start = True

    # -- turns ----------------------------------------------------------------

    def begin(self, *, thinking: bool) -> "ReplyView":
        """The observer of a new turn; THINKING: the model will be asked."""
        self.view = ReplyView(self)
        if thinking:
            self.show_thinking()
        return self.view

    def end(self, view: "ReplyView", *, aborted: bool = False) -> None:
        """The turn of VIEW is over: drop the indicator, settle an unanswered preview."""
        view.close(aborted=aborted)
        if self.view is view:
            self.view = None
        self._hide_thinking()

    def deliver(self, text: str) -> None:
        """What the kernel's terminal actuator shows (its `writer`)."""
        if self.view is not None:
            self.view.deliver(visible(text))
        else:
            self.block(text)


class ReplyView(TurnObserver):
    """One turn on the terminal: its streamed preview and how the reply settles it."""

    def __init__(self, output: TerminalOutput):
        self.output = output
        self.extractor = TextExtractor()
        self.preview: list[str] = []   # visible text streamed by the current attempt
        self.reply_done = False
        self.settled = False           # the first delivered text answered the preview
        self.delivered = False         # the kernel showed something for this turn
        self.thought = False           # the current attempt's thinking is shown

    def on_chunk(self, text: str) -> None:
        if self.reply_done:
            self._retry()
        delta = self.extractor.feed(text)
        if delta and self.output.live:
            if self.thought and not self.preview:
                self.output.finish_line()      # the reply on a line of its own
            delta = visible(delta)
            self.preview.append(delta)
            self.output.text(delta)

    def on_thinking(self, text: str, fresh: bool) -> None:
        if not self.output.thoughts:
            return
        if self.reply_done:
            self._retry()
        if fresh and self.thought:             # asked again: its thinking on a new line
            self.output.finish_line()
        self.thought = True
        self.output.thought(text)

    def on_reply_done(self) -> None:
        self.reply_done = True

    def _retry(self) -> None:
        """The last reply was rejected and the model streams another: say so, start anew."""
        self.reply_done = False
        self.extractor = TextExtractor()
        if self.preview:
            self.preview.clear()
            self.output.notice(RETRYING)
            self.output.show_thinking()
        elif self.thought:                     # a step of the tool loop, say: no preview
            self.output.finish_line()
        self.thought = False

    def deliver(self, text: str) -> None:
        """The kernel shows TEXT (visible) for this turn.  The first text is what it
        kept of the reply: it finishes the preview or replaces it."""
        self.delivered = True
        if self.settled:
            self.output.block(text)
            return
        self.settled = True
        shown = "".join(self.preview)
        if shown and text == shown:
            self.output.finish_line()
            return
        if shown:
            self.output.notice(NOT_KEPT)
        self.output.block(text)

    def close(self, *, aborted: bool) -> None:
        """The turn ended; a preview nobody answered is marked as not kept."""
        if self.preview and not self.settled:
            self.settled = True
            if aborted:
                self.output.finish_line()
            else:
                self.output.notice(ABANDONED)


def status_line(view: dict[str, Any]) -> str:
    """A thread's status, like Emacs' header line, from `Kernel.view`."""
    cost = f"${view.get('cost-usd', 0.0):.4f}"
    if not view.get("cost-known", True):
        cost = "≥" + cost
    parts = [f"turn {view.get('turn', 0)}", f"context {view.get('context-percent', 0)}%",
             f"cost {cost}", f"latency {view.get('latency-ms', 0):.0f} ms",
             f"backend {view.get('backend', '?')}", f"branch {view.get('branch', '?')}"]
    session = view.get("session")
    if session not in (None, "ready", "dormant"):
        parts.append(f"session {session}")
    return visible(" · ".join(parts))
