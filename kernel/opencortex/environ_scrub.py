"""Hide secrets from /proc/<pid>/environ, which any process of the same user can read.

/proc/<pid>/environ shows the environment block the kernel (Linux) placed on the
process's stack at exec; `os.environ.pop` and `unsetenv` do not change it.  So a
command the person approved could print the kernel's secret and provider keys
with `cat /proc/$PPID/environ`.  `scrub_process_environment` overwrites, in that
block, the value of `OPENCORTEX_SECRET` and of every variable whose name looks
like a key or secret (`SECRET_NAME`) with `*`, keeping names and lengths.

Python's `os.environ` is a copy made at start-up, so backends still read their
keys; the C-level environment, which `getenv` and inheriting children use,
still pointed into the block, so each hidden variable Python still has is set
again there (a fresh copy on the heap).  Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys

log = logging.getLogger(__name__)

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
"""Names of variables that hold secrets: hidden here, and never passed to an approved
command (`actuators.shell`).  Defined here, a light module `serve` imports before
its port line."""

KERNEL_SECRET = "OPENCORTEX_SECRET"
FILLER = b"*"
ENV_START_FIELD = 50            # fields of /proc/self/stat, numbered from 1 as in proc(5)
ENV_END_FIELD = 51
_failure_logged = False


class ScrubError(RuntimeError):
    """The environment block could not be found or checked; nothing was written."""


def is_secret_name(name: bytes) -> bool:
    """Whether a variable called NAME holds something to hide."""
    text = name.decode("utf-8", "replace")
    return text == KERNEL_SECRET or bool(SECRET_NAME.search(text))


def environment_bounds(stat_line: str) -> tuple[int, int]:
    """env_start and env_end from a /proc/<pid>/stat line (the name in parentheses may
    hold spaces and parentheses: fields are counted after the last ")")."""
    after_name = stat_line[stat_line.rindex(")") + 1:].split()
    first = 3                                       # the field after the name
    try:
        start = int(after_name[ENV_START_FIELD - first])
        end = int(after_name[ENV_END_FIELD - first])
    except (IndexError, ValueError):
        raise ScrubError("/proc/self/stat has no environment bounds") from None
    if not 0 < start < end:
        raise ScrubError("/proc/self/stat hides the environment bounds")
    return start, end


def secret_spans(block: bytes) -> list[tuple[bytes, int, int]]:
    """(name, start, end) of each secret value in BLOCK ("NAME=value\\0" entries)."""
    spans, offset = [], 0
    for entry in block.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and value and is_secret_name(name):
            start = offset + len(name) + 1
            spans.append((name, start, start + len(value)))
        offset += len(entry) + 1
    return spans


def scrub_block(address: int, size: int) -> list[bytes]:
    """Overwrite the secret values in the SIZE bytes at ADDRESS; the names hidden."""
    with open("/proc/self/environ", "rb") as handle:
        shown = handle.read()
    block = ctypes.string_at(address, size)
    if block != shown:
        raise ScrubError("the environment block is not where /proc/self/stat says")
    spans = secret_spans(block)
    for _, start, end in spans:
        ctypes.memmove(address + start, FILLER * (end - start), end - start)
    return [name for name, _, _ in spans]


def restore_c_environment(names: list[bytes]) -> None:
    """Set NAMES again from Python's copy, so `getenv` and children see the real values."""
    for name in names:
        value = os.environb.get(name)
        if value is not None:
            os.putenv(name, value)


def scrub_process_environment() -> int:
    """Hide this process's secrets from /proc/self/environ; how many values were hidden.

    Call it once at start (`serve`, `chat`).  On failure it logs once (never a value)
    and returns 0: the kernel carries on."""
    global _failure_logged
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/stat") as handle:
            start, end = environment_bounds(handle.read())
        names = scrub_block(start, end - start)
        restore_c_environment(names)
        return len(names)
    except (OSError, ValueError, ScrubError) as error:
        if not _failure_logged:
            _failure_logged = True
            log.warning("could not hide secrets from /proc/self/environ: %s",
                        error if isinstance(error, ScrubError) else type(error).__name__)
        return 0
