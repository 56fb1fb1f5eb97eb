"""What the person types into the terminal chat: an editable prompt, or piped lines.

`PromptInput` (stdin and stdout are a terminal) edits with prompt_toolkit, so
arrow keys move the cursor and recall history instead of sending escape
sequences.  Enter sends; Alt-Enter (Esc then Enter) or Ctrl-J starts a new line,
and a paste keeps its lines.  Ctrl-C clears a line being typed and, on an
empty line, asks to leave; Ctrl-D on an empty line leaves.  History is kept in
a file of its own, readable by the person alone (0600), holding nothing but
what they sent.

`PipedInput` (anything else) reads one message a line, without prompt_toolkit.

Both hand back `Typed`.  A line that is not valid UTF-8 comes back as
"undecodable", never as text: it is reported and skipped.
"""

from __future__ import annotations

import asyncio
import os
import queue
import termios
import threading
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Literal, NamedTuple, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.application.current import set_app
from prompt_toolkit.enums import DEFAULT_BUFFER
from prompt_toolkit.filters import has_focus
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

PROMPT = "you> "
CONTINUATION = "...  "
NOT_SENT = "that line is not valid UTF-8 (is the terminal's encoding UTF-8?); it was not sent"


class Typed(NamedTuple):
    """One reading of the person: a message, or why there is none.

    KIND: "text" (TEXT is the message), "end" (Ctrl-D or end of input),
    "interrupt" (Ctrl-C on an empty line), "undecodable" (TEXT says what was
    skipped)."""

    kind: Literal["text", "end", "interrupt", "undecodable"]
    text: str = ""


class UndecodableLine(Exception):
    """Enter was pressed on a line holding bytes that are not UTF-8."""


def decodable(text: str) -> bool:
    """Whether TEXT came from valid UTF-8 (prompt_toolkit keeps bad bytes as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _private_append(path: Path, data: bytes) -> None:
    """Append DATA to PATH in one write, creating it readable by its owner alone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as handle:
        handle.write(data)


class PrivateHistory(FileHistory):
    """prompt_toolkit's file history, in a file only its owner can read (0600)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        _private_append(path, b"")
        os.chmod(path, 0o600)
        super().__init__(str(path))

    def store_string(self, string: str) -> None:
        """Keep STRING (one sent message; its lines marked "+") in one append."""
        if not decodable(string):
            return
        lines = "".join(f"+{line}\n" for line in string.split("\n"))
        stamp = datetime.now().isoformat(sep=" ", timespec="seconds")
        _private_append(Path(self.filename), f"\n# {stamp}\n{lines}".encode("utf-8"))


def _key_bindings() -> KeyBindings:
    """Enter sends, Alt-Enter / Esc Enter / Ctrl-J add a line, Ctrl-C clears or asks to leave."""
    keys = KeyBindings()
    editing = has_focus(DEFAULT_BUFFER)

    @keys.add("enter", filter=editing)
    def _send(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if not decodable(buffer.text):
            event.app.exit(exception=UndecodableLine())
            return
        buffer.validate_and_handle()

    @keys.add("escape", "enter", filter=editing)
    @keys.add("c-j", filter=editing)
    def _new_line(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    @keys.add("c-c", filter=editing)
    def _interrupt(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if buffer.text:
            buffer.reset()
        else:
            event.app.exit(exception=KeyboardInterrupt())

    return keys


def _continuation(width: int, line_number: int, wrap_count: int) -> str:
    """What stands before the second and later lines of a message, as wide as the prompt."""
    return CONTINUATION[:width].rjust(width)


class PromptInput:
    """The editable prompt, with history in HISTORY_FILE and STATUS as its bottom line."""

    def __init__(self, history_file: Path, status: Callable[[], str]):
        self.session: PromptSession[str] = PromptSession(
            history=PrivateHistory(history_file), multiline=True,
            key_bindings=_key_bindings(), prompt_continuation=_continuation,
            bottom_toolbar=status, reserve_space_for_menu=0, enable_open_in_editor=False)
        self._interrupted = False

    async def read(self) -> Typed:
        """Wait for the person to send something (Ctrl-C is a key here, not a signal)."""
        if self._interrupted:
            self._interrupted = False
            return Typed("interrupt")
        try:
            text = await self.session.prompt_async(PROMPT, handle_sigint=False)
        except EOFError:
            return Typed("end")
        except KeyboardInterrupt:
            return Typed("interrupt")
        except UndecodableLine:
            return Typed("undecodable", NOT_SENT)
        return Typed("text", text)

    def interrupt(self) -> None:
        """SIGINT outside a turn: Ctrl-C pressed between two prompts, or a signal sent
        while one waits.  Either reads as Ctrl-C at the prompt."""
        app = self.session.app
        if app.is_running:
            app.exit(exception=KeyboardInterrupt())
        else:
            self._interrupted = True

    def run_above(self, write: Callable[[], None]) -> None:
        """Run WRITE now, or, while the prompt is shown, above it (the prompt is redrawn)."""
        app = self.session.app
        if not app.is_running:
            write()
            return
        with set_app(app):
            run_in_terminal(write)


class PipedInput:
    """Lines of a stdin that is not a terminal, one message each.

    Lines are read on a daemon thread, so leaving never waits for a read that
    may never end.  A SIGINT while waiting for a line ends the input."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.line_number = 0
        self._requests: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop,
                                                asyncio.Future[bytes]]] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._pending: asyncio.Future[bytes] | None = None
        self._interrupted = False

    async def read(self) -> Typed:
        """The next line as a message; "end" at the end of the input or after a SIGINT."""
        if self._interrupted:
            return Typed("end")
        raw = await self._next_line()
        if not raw:
            return Typed("end")
        self.line_number += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            return Typed("undecodable", f"input line {self.line_number} is not valid UTF-8 "
                         f"(byte {raw[error.start]:#04x} at byte {error.start + 1}); skipped")
        text = text[:-1] if text.endswith("\n") else text
        return Typed("text", text[:-1] if text.endswith("\r") else text)

    def interrupt(self) -> None:
        """End the input: the line being waited for, and any after it, read as the end."""
        self._interrupted = True
        if self._pending is not None and not self._pending.done():
            self._pending.set_result(b"")

    async def _next_line(self) -> bytes:
        loop = asyncio.get_running_loop()
        self._pending = loop.create_future()
        self._requests.put((loop, self._pending))
        if self._reader is None:
            self._reader = threading.Thread(target=self._serve, name="opencortex-stdin",
                                            daemon=True)
            self._reader.start()
        try:
            return await self._pending
        finally:
            self._pending = None

    def _serve(self) -> None:
        """The reader thread: one line per request, b"" at the end (or on a read error)."""
        while True:
            loop, future = self._requests.get()
            try:
                line = self.stream.readline()
            except (OSError, ValueError):
                line = b""
            try:
                loop.call_soon_threadsafe(_resolve, future, line)
            except RuntimeError:  # the loop is closed: the chat is over
                return


def _resolve(future: asyncio.Future[bytes], line: bytes) -> None:
    """On the loop: hand LINE to the read waiting for it, unless that was given up."""
    if not future.done():
        future.set_result(line)


@contextmanager
def keyboard_held(stream: TextIO) -> Iterator[None]:
    """Outside the prompt (while a reply streams), keys typed are neither echoed over
    the chat's output nor cooked by the terminal: they wait, as typed, for the next
    prompt, where Enter still sends.  Ctrl-C still interrupts."""
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, AttributeError, termios.error):
        fd, saved = None, []
    if fd is not None:
        held = [*saved[:6], list(saved[6])]
        held[0] &= ~termios.ICRNL           # Enter stays Enter for the prompt
        held[3] &= ~(termios.ECHO | termios.ICANON)
        held[6][termios.VMIN], held[6][termios.VTIME] = 1, 0
        termios.tcsetattr(fd, termios.TCSANOW, held)
    try:
        yield
    finally:
        if fd is not None:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
