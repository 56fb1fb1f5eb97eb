"""Ctrl-C while a chat waits on the event loop: a callback, not a KeyboardInterrupt."""

from __future__ import annotations

import asyncio
import signal
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def sigint_calls(callback: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGINT (Ctrl-C outside the prompt) calls CALLBACK on the running
    loop instead of raising KeyboardInterrupt wherever the program happens to be."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        installed = False
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
