"""Who may write a home: it must be writable, and a serving kernel is its only writer.

Commands that write the archive (chat, reindex, forget) check the home is writable
first, saying once and clearly what still works when it is not, and hold the
home's lock while they write (`homelock`): while `opencortex serve` runs for the
home, they are refused and told how to reach the running kernel instead.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from opencortex.homelock import HomeInUse, HomeLock
from opencortex.homepath import memory_dir

if TYPE_CHECKING:
    from opencortex.config import Config


class HomeNotWritable(OSError):
    """The home cannot be written; the message says so once, with what still works."""


def home_problem(home: Path) -> str | None:
    """Why HOME cannot be written (None when it can): one try at a temporary file in
    its archive's directory."""
    archive = memory_dir(home)
    try:
        archive.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=archive, prefix=".write-test-"):
            pass
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def require_writable_home(home: Path, what: str) -> None:
    """Refuse WHAT (chatting, serving, …) at once, clearly, when HOME is read-only.
    Light: serve asks before its configuration is read (see `serve_port`)."""
    problem = home_problem(home)
    if problem is not None:
        raise HomeNotWritable(f"cannot write to {home} ({problem}); {what} needs a "
                              "writable home: fix its permissions or pass --home DIR. "
                              "`opencortex memory search` still works.")


@contextmanager
def sole_writer(config: Config) -> Iterator[None]:
    """Hold the home's lock while this command writes its archive: a kernel serving the
    home (`opencortex serve`) is its only writer, so this refuses (HomeInUse) then."""
    try:
        lock = HomeLock(config.home)
    except HomeInUse as error:
        raise HomeInUse(f"{error}; talk to it with Emacs, a bridge, or `opencortex client` "
                        "(when it serves --ws)") from None
    try:
        yield
    finally:
        lock.release()
