"""Log records as visible text, one line per message: what a library logs may quote
what a stranger sent.

The kernel's own log calls never carry content, but the libraries it runs do log
remote strings now and then (matrix-nio names a sender's device id or an event
type it did not expect; a traceback ends with an exception's text).  Those are
chosen by whoever sent them, so on the way to the terminal their control
characters become visible stand-ins (`untrusted.visible`: no escape sequence
reaches the terminal) and a line break within a message becomes " ⏎ ", so no
one can forge a log line of their own.  A traceback keeps its lines, each made
visible.
"""

from __future__ import annotations

import logging
import sys

from opencortex.untrusted import visible

FORMAT = "%(levelname)s %(name)s: %(message)s"


class VisibleFormatter(logging.Formatter):
    """A Formatter whose messages are one visible line and tracebacks visible lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record)).replace("\n", " \u23ce ")

    def formatException(self, ei) -> str:  # type: ignore[no-untyped-def]
        return visible(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return visible(super().formatStack(stack_info))


def log_to_stderr(verbose: bool) -> None:
    """Log to stderr, as visible lines: INFO and up when VERBOSE, else WARNING and up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VisibleFormatter(FORMAT))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
