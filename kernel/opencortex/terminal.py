"""The terminal chat: `opencortex chat` without --message.

One loop: read what the person sends (`opencortex.terminal_input`), run it as
a turn of the kernel while the reply streams (`opencortex.terminal_output`),
show the thread's status, repeat.

- Ctrl-C while a reply is on its way aborts that turn: its task is cancelled,
  so nothing of it is archived (see `Kernel.handle`) and the chat goes on.  If
  the reply had already been verified and shown, the turn completes and the
  chat says so.  At the prompt, Ctrl-C on an empty line and then Ctrl-C again
  leaves, as does Ctrl-D.
- The chat's own commands: /quit (or /exit) and /reload; /help adds the keys
  to the kernel's help.  Every other line, slash commands included, goes to
  the kernel.
- When stdin or stdout is not a terminal, each input line is one message,
  replies are printed as plain lines, and nothing else is drawn.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from contextlib import nullcontext

from opencortex import __version__
from opencortex.config import Config
from opencortex.conversation.commands import is_command
from opencortex.events import EventError, Thread, chat_message
from opencortex.interrupts import sigint_calls
from opencortex.kernel import Kernel
from opencortex.runtime import build_kernel
from opencortex.terminal_input import PipedInput, PromptInput, Typed, keyboard_held
from opencortex.terminal_output import ReplyView, TerminalOutput, status_line
from opencortex.turn import TurnResult

log = logging.getLogger(__name__)

EXIT_OK = 0
HISTORY_FILE = "chat-history"  # in the kernel home
LEAVE_WORDS = ("/quit", "/exit")
KEYS = ("Enter sends, Alt-Enter (Esc Enter) a new line, ↑/↓ history, Ctrl-C aborts a reply, "
        "Ctrl-D leaves; /help")
TERMINAL_HELP = "Terminal chat:\n/reload — reload skills from disk\n/quit or /exit — leave"
PIPED_HELP = " (as does the end of the input)\nEach input line is one message."
KEYS_HELP = (" (as do Ctrl-D and Ctrl-C twice on an empty line)\n"
             "Enter sends; Alt-Enter, Esc then Enter, or Ctrl-J starts a new line; "
             "a paste keeps its lines\n"
             "↑/↓ recall what you sent before (kept in {history}, readable by you alone)\n"
             "Ctrl-C while a reply is on its way aborts that turn: nothing of it is archived\n"
             "Ctrl-C clears a line being typed; on an empty line it asks, a second one leaves")
ABORTED = ("Turn aborted: nothing of it was archived. Send the message again when you "
           "are ready.")
TOO_LATE = "Ctrl-C came after the reply was verified and shown: that turn was kept."
ASK_LEAVE = "(Ctrl-C again or Ctrl-D leaves; /help lists the keys)"


async def run_chat(config: Config, thread: Thread, *, session: str | None = None) -> int:
    """Chat on THREAD in this terminal until the person leaves; the exit status."""
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    output = TerminalOutput(sys.stdout, sys.stderr, live=interactive,
                            color=interactive and not os.environ.get("NO_COLOR"),
                            thoughts=config.chat.show_thinking)
    kernel = build_kernel(config, writer=output.deliver)
    try:
        await kernel.start(wait=False)   # MCP servers: their tools join as each comes up
        return await TerminalChat(kernel, thread, output, interactive=interactive).run(session)
    finally:
        await kernel.aclose()


def startup_warnings(kernel: Kernel) -> list[str]:
    """Broken skills and a backend that is not the configured one."""
    warnings = [str(error) for error in kernel.skills.errors]
    if kernel.backend.warning:
        warnings.append(kernel.backend.warning)
    return warnings


class TerminalChat:
    """The chat of one thread in this terminal."""

    def __init__(self, kernel: Kernel, thread: Thread, output: TerminalOutput, *,
                 interactive: bool):
        self.kernel = kernel
        self.thread = thread
        self.output = output
        self.interactive = interactive
        self.status = ""
        self.history = kernel.config.home / HISTORY_FILE
        self.source: PromptInput | PipedInput
        if interactive:
            self.source = PromptInput(self.history, lambda: self.status)
            output.above_prompt = self.source.run_above
        else:
            self.source = PipedInput(sys.stdin.buffer)
        self.running: asyncio.Task[TurnResult] | None = None
        self.asked_to_leave = False

    async def run(self, session: str | None) -> int:
        """Greet, then take what the person sends until they leave."""
        held = keyboard_held(sys.stdin) if self.interactive else nullcontext()
        with sigint_calls(self._on_sigint), held:
            await self._start(session)
            while await self._take(await self.source.read()):
                pass
        self.output.finish_line()
        return EXIT_OK

    async def _start(self, session: str | None) -> None:
        """Load the saved SESSION, if any; warn; say how the chat works."""
        if session:
            self.output.notice(
                await self.kernel.run_command(self.thread, f"/load {shlex.quote(session)}"))
        for warning in startup_warnings(self.kernel):
            self.output.notice(f"warning: {warning}")
        self.output.notice(f"opencortex {__version__} — thread {self.thread}, backend "
                           f"{self.kernel.backend.name}.")
        self.output.notice(KEYS if self.interactive else "/help lists commands; /quit or "
                           "Ctrl-D leaves.")
        await self._refresh_status()

    async def _take(self, typed: Typed) -> bool:
        """Act on TYPED; False when the person leaves."""
        if typed.kind == "end":
            return False
        if typed.kind == "interrupt":
            if self.asked_to_leave:
                return False
            self.asked_to_leave = True
            self.output.notice(ASK_LEAVE)
            return True
        self.asked_to_leave = False
        if typed.kind == "undecodable":
            self.output.notice(typed.text)
            return True
        return await self._line(typed.text)

    async def _line(self, text: str) -> bool:
        """A line the person sent: the chat's own command, or a turn of the kernel."""
        word = text.strip()
        if not word:
            return True
        if word in LEAVE_WORDS:
            return False
        if word == "/reload":
            self._reload()
            return True
        await self._turn(text)
        if word.split()[0].lower() == "/help":
            self.output.block(self._help())
        return True

    def _reload(self) -> None:
        """/reload: read the skills again; say what broke."""
        errors = self.kernel.skills.reload()
        self.output.notice(f"reloaded {len(self.kernel.skills.skills)} skills")
        for error in errors:
            self.output.notice(f"warning: {error}")

    def _help(self) -> str:
        """What /help adds to the kernel's list: the chat's own commands and keys."""
        if not self.interactive:
            return TERMINAL_HELP + PIPED_HELP
        return TERMINAL_HELP + KEYS_HELP.format(history=self.history)

    # -- turns ----------------------------------------------------------------

    async def _turn(self, text: str) -> None:
        """Run TEXT as one turn while its reply streams; Ctrl-C cancels it."""
        try:
            event = chat_message(text, self.thread.channel, self.thread.chat_id)
        except EventError as error:
            self.output.notice(f"not sent: {error}")
            return
        view = self.output.begin(thinking=not is_command(text))
        task = asyncio.create_task(self.kernel.handle(event, view))
        self.running = task
        try:
            await asyncio.wait({task})
        finally:
            self.running = None
            if not task.done():  # this chat itself is being cancelled
                task.cancel()
        self._report(task, view)
        await self._refresh_status()

    def _report(self, task: asyncio.Task[TurnResult], view: ReplyView) -> None:
        """How the turn of TASK ended, beyond what the kernel already showed."""
        if task.cancelled():
            self.output.end(view, aborted=True)
            self.output.notice(TOO_LATE if view.delivered else ABORTED)
            return
        error = task.exception()
        if error is not None:
            self.output.end(view, aborted=True)
            log.error("turn failed unexpectedly: %s", type(error).__name__)
            self.output.notice(f"Kernel error ({type(error).__name__}): the message was not "
                               "archived; send it again.")
            return
        self.output.end(view)
        result = task.result()
        if result.thread.channel != "cli":  # the terminal actuator showed only cli errors
            for message in result.errors:
                self.output.notice(f"error: {message}")

    def _on_sigint(self) -> None:
        """Ctrl-C outside the prompt: abort the running turn, or end the input."""
        task = self.running
        if task is not None:
            if not task.done() and not task.cancelling():
                task.cancel()
            return
        self.source.interrupt()

    async def _refresh_status(self) -> None:
        """Fetch the thread's figures for the status line under the prompt."""
        if self.interactive:
            self.status = status_line(await self.kernel.view(self.thread))
