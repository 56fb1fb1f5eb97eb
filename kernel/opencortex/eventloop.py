"""The event loop `opencortex serve` runs on: uvloop where installed, else asyncio's own.

uvloop runs the loop, its sockets and its timers in libuv (C).  Under bench_load's 20
EPC clients it cut the kernel's CPU per turn from 2.45 to 2.19 ms and raised sustained
turns from 444 to 493 a second on the 2-core machine the figures come from; nothing a
turn does changes.  A turn's trips to its threads and back wake the loop from another
thread, which uvloop does sooner: bench_core's echo turn, 2.62 -> 2.34 ms (p50).  The
terminal chat keeps asyncio's loop: prompt_toolkit read an arrow key's escape sequence
as separate keys on uvloop (tests/test_terminal.py).  `event_loop = "asyncio"` in
config.toml keeps asyncio's loop (for debugging with its debug mode, or a platform
without uvloop); `"uvloop"` insists on it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Literal, TypeVar

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
T = TypeVar("T")


class EventLoopUnavailable(RuntimeError):
    """`event_loop = "uvloop"` was asked for where uvloop is not installed."""


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop CHOICE names; None for asyncio's default loop."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise EventLoopUnavailable(
                'event_loop = "uvloop" but uvloop is not installed; install it '
                '(pip install uvloop) or set event_loop = "auto"') from None
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """"uvloop" or "asyncio": which kind LOOP is (for `/metrics` and `doctor`)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice = "auto") -> T:
    """Run MAIN to its end on a new loop of CHOICE, closed after (as `asyncio.run`)."""
    try:
        factory = loop_factory(choice)
    except EventLoopUnavailable:
        main.close()                   # never started: no "never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
