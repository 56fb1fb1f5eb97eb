"""How the `opencortex` command reports: exit codes, usage errors and `--json`.

Exit codes: 0 ok, 1 failed, 2 usage (a bad option or argument).

With `--json` anywhere on the command line, standard output holds exactly one
JSON object, whatever happens.  A command's result has its own shape (a turn:
`status`, `text`, `errors`, …); when the command cannot run at all (bad
arguments, blank text, an unknown thread channel, a configuration error, a
home that cannot be written) the object is::

    {"status": "error", "error": "what is wrong and what to do",
     "errors": ["what is wrong and what to do", ...], "exit": 1}

`error` is the first of `errors`; `exit` repeats the exit code (2 for usage).
Without `--json` the same text goes to standard error as "opencortex: …".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn, Sequence

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """The command line is wrong; PARSER is the (sub)command whose usage applies."""

    def __init__(self, message: str, parser: argparse.ArgumentParser):
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of printing and exiting,
    so the caller decides how to report (plain text or one JSON object)."""

    subcommands: Any = None     # the subparsers action, once added

    def add_subparsers(self, **kwargs: Any) -> Any:
        """As argparse's, remembering the action (to find a subcommand's usage)."""
        self.subcommands = super().add_subparsers(**kwargs)
        return self.subcommands

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self)


def wants_json(argv: Sequence[str]) -> bool:
    """Whether `--json` is among the arguments (asked before they are parsed)."""
    return "--json" in argv


def print_json(data: Any) -> None:
    """DATA as one JSON object on standard output."""
    print(json.dumps(data, ensure_ascii=False, indent=2))


def error_object(errors: Sequence[str], code: int = EXIT_FAILED) -> dict[str, Any]:
    """The `--json` object of a command that could not run."""
    found = [str(error) for error in errors] or ["failed for an unknown reason"]
    return {"status": "error", "error": found[0], "errors": found, "exit": code}


def fail(message: str, *, as_json: bool, code: int = EXIT_FAILED) -> int:
    """Report MESSAGE (one JSON object, or a line on standard error); returns CODE."""
    if as_json:
        print_json(error_object([message], code))
    else:
        print(f"opencortex: {message}", file=sys.stderr)
    return code


def usage_failure(error: UsageError, *, as_json: bool) -> int:
    """Report a bad command line the way argparse would, or as one JSON object."""
    if as_json:
        usage = " ".join(error.parser.format_usage().split())
        print_json({**error_object([f"{error}"], EXIT_USAGE), "usage": usage})
    else:
        error.parser.print_usage(sys.stderr)
        print(f"{error.parser.prog}: error: {error}", file=sys.stderr)
    return EXIT_USAGE


def reader_gone() -> int:
    """Standard output was closed by its reader: stop quietly (no second error while
    Python flushes it at exit); returns EXIT_FAILED."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_FAILED
