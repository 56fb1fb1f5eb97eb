"""The terminal actuator: prints replies where the person is typing.

Text is printed through `opencortex.untrusted.visible`: a control character or
escape sequence in a reply is shown, never obeyed by the terminal."""

from __future__ import annotations

import sys
from typing import Callable, TextIO

from opencortex.actuators.base import MessageActuator
from opencortex.untrusted import visible


class CliActuator(MessageActuator):
    """Prints text to a stream (stdout by default) or hands it to a writer."""

    targets = ("cli",)

    def __init__(self, stream: TextIO | None = None,
                 writer: Callable[[str], None] | None = None):
        self.stream = stream
        self.writer = writer
        self.printed: list[str] = []

    async def deliver(self, address: str, text: str, key: str | None = None) -> None:
        text = visible(text)
        self.printed.append(text)
        if self.writer is not None:
            self.writer(text)
            return
        stream = self.stream or sys.stdout
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()
