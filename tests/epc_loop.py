"""A real `KernelEpcServer` in the test process, served by an asyncio loop on a thread
of its own, both stopped (bounded) by `stop`."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from opencortex.epc import KernelEpcServer


class LoopServer:
    """`KernelEpcServer(loop, SECRET, METHODS, **OPTIONS)` served until `stop`."""

    def __init__(self, secret: str, methods: dict, **options: Any):
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.loop_thread.start()
        self.server = KernelEpcServer(self.loop, secret, methods, **options)
        self.on_loop(self.server.start())

    @property
    def port(self) -> int:
        return self.server.port

    def on_loop(self, coroutine: Any, timeout: float = 10.0) -> Any:
        """Run COROUTINE on the server's loop and wait (bounded) for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        """Close the server and its connections, then stop and close the loop."""
        self.on_loop(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(10)
        self.loop.close()
