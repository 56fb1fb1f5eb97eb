"""A real `KernelEpcServer` in the test process: its asyncio loop and its accept loop
each on a thread of their own, both stopped (bounded) by `stop`."""

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
        self.serve_thread = threading.Thread(target=self.server.serve_forever,
                                             kwargs={"poll_interval": 0.05}, daemon=True)
        self.serve_thread.start()

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        """Stop accepting, close the server, then stop and close the loop."""
        self.server.shutdown()
        self.server.server_close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.serve_thread.join(10)
        self.loop_thread.join(10)
        self.loop.close()
