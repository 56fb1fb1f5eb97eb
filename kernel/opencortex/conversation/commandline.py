"""What a slash command is, and the table of them: their names, usage lines and handlers.

A command is a message whose first word is "/" and a letter, then letters or
hyphens (`/help`, `/rewind 3`, `/no-such-thing`).  Handlers register with
`command`; `commands.Commands` runs them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

COMMAND_WORD = re.compile(r"/[a-z][a-z-]*")


class CommandError(ValueError):
    """A command was misused; the message says how to use it."""


@dataclass
class CommandInput:
    """What a command may read besides the conversation."""

    persona: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    skills: Any = None          # the kernel's SkillRegistry, for /reload
    budget: str = ""            # what is left of this chat's budgets, for /budget
    guest: bool = False         # whoever typed it is a guest (see OWNERS_ONLY)


# a handler: (Commands, Conversation, arguments, CommandInput) -> the answer
Handler = Callable[[Any, Any, list[str], CommandInput], Awaitable[str]]
USAGE: dict[str, str] = {}
HANDLERS: dict[str, Handler] = {}
FREE_TEXT: set[str] = set()     # commands whose argument is the rest of the line, as typed
OWNERS_ONLY: set[str] = set()   # commands that change the kernel for every chat: no guest's


def command(name: str, usage: str, *, free_text: bool = False, owners_only: bool = False):
    """Register a slash command; with FREE_TEXT, its handler gets the rest of the line
    as one argument (apostrophes and quotes are text: "/recall Caroline's dog"), else
    the words of the line, split as a shell would.  OWNERS_ONLY: it changes the kernel
    for every chat, so a guest may not run it (see `Commands.run`)."""
    def register(handler: Handler) -> Handler:
        HANDLERS[name] = handler
        USAGE[name] = usage
        if free_text:
            FREE_TEXT.add(name)
        if owners_only:
            OWNERS_ONLY.add(name)
        return handler
    return register


def rest_argument(text: str) -> list[str]:
    """The rest of the command line TEXT after its first word, spacing collapsed, as one
    argument (none when empty); one pair of quotes around all of it is dropped."""
    rest = " ".join(text.split()[1:])
    if len(rest) >= 2 and rest[0] == rest[-1] and rest[0] in "\"'":
        rest = rest[1:-1].strip()
    return [rest] if rest else []


def first_word(text: str) -> str:
    """The first word of TEXT, lower case ("" for none)."""
    stripped = text.strip()
    return stripped.split(maxsplit=1)[0].lower() if stripped else ""


def is_command(text: str) -> bool:
    """Whether TEXT is a slash command, known or not (see the module docstring)."""
    return COMMAND_WORD.fullmatch(first_word(text)) is not None


def unknown_command(name: str) -> str:
    """The error for /NAME: the closest command, and the list."""
    close = difflib.get_close_matches(name, HANDLERS, n=1, cutoff=0.6)
    hint = f" Did you mean /{close[0]}?" if close else ""
    names = " ".join(f"/{known}" for known in sorted(HANDLERS))
    return (f"There is no command /{name}.{hint} Commands: {names}. (To send text starting "
            "with /word to the model, put another character first.)")


def number_argument(argument: str, what: str) -> int:
    """ARGUMENT as a number of its own, WHAT naming it in the error (CommandError)."""
    try:
        value = int(argument)
    except ValueError:
        raise CommandError(f"{what} must be a number, not {argument!r}") from None
    if value < 0:
        raise CommandError(f"{what} must not be negative")
    return value


def short(text: str, width: int = 100) -> str:
    """TEXT on one line, cut to WIDTH characters with "…"."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 1] + "…"
