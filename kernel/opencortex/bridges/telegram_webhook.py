"""Telegram's webhook, received: the HTTP endpoint Telegram POSTs updates to.

Telegram delivers each update as a POST of one JSON `Update`, carrying the
secret given to `setWebhook` in the `X-Telegram-Bot-Api-Secret-Token` header,
and delivers it again later when the answer is not 2xx.  The receiver speaks
plain HTTP, on 127.0.0.1 by default: a reverse proxy (nginx, Caddy) terminates
TLS at the public https URL and forwards here.

Durability is that of polling: an update is queued for `take`, and the request
that brought it is answered 200 only once `confirm` says the bridge kept it (in
its fsynced inbox).  Not confirmed within `ack_timeout` seconds, it is answered
500 and Telegram redelivers it (the inbox recognises the update id).  With
`max_pending` updates waiting, more are answered 503 (Telegram retries later).
A request without the right secret gets 403 and nothing else happens; a body
over `max_body` bytes gets 413; an update python-telegram-bot cannot read gets
200 and is skipped, so it cannot block Telegram's queue.  Log lines carry
counts and update ids, never content.

HTTP is served by aiohttp rather than a hand-written parser on asyncio
streams: this port faces the internet through the proxy, and aiohttp's
maintained HTTP/1.1 parser handles chunked bodies, keep-alive, pipelining and
size limits.  It is imported only in webhook mode.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from opencortex.bridges.contract import Unreadable
from opencortex.throttled_log import ThrottledLog

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY = 1 << 20        # bytes; Telegram's updates are a few KiB
MAX_PENDING = 1000        # updates waiting for the bridge
ACK_TIMEOUT = 10.0        # seconds a request waits for the bridge to keep its update
BATCH = 100               # updates handed out per take
KEPT, REDELIVER, LATER = 200, 500, 503


@dataclass(eq=False)
class Delivery:
    """One update's item, and the HTTP status its request is waiting for."""

    item: Any
    answer: asyncio.Future[int]

    def settle(self, status: int) -> None:
        """Answer the request with STATUS (once; later answers are ignored)."""
        if not self.answer.done():
            self.answer.set_result(status)


class WebhookReceiver:
    """Receives Telegram's webhook POSTs at PATH on HOST:PORT; `parse` turns an update
    (a JSON object) into what `take` hands out, or None for an update to skip."""

    def __init__(self, host: str, port: int, path: str, secret: str,
                 parse: Callable[[dict[str, Any]], Any], *, max_body: int = MAX_BODY,
                 max_pending: int = MAX_PENDING, ack_timeout: float = ACK_TIMEOUT):
        self.host, self.port, self.path = host, port, path
        self._secret = secret.encode()
        self._parse = parse
        self.max_body, self.max_pending, self.ack_timeout = max_body, max_pending, ack_timeout
        self._queue: deque[Delivery] = deque()
        self._taken: list[Delivery] = []
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._refused = ThrottledLog("telegram webhook: refused a request without the right "
                                     "secret token", logger=log)
        self._full = ThrottledLog(f"telegram webhook: {max_pending} updates already wait for "
                                  "the bridge; answered 503, Telegram retries", logger=log)
        self._unreadable = Unreadable("telegram webhook")

    @property
    def pending(self) -> int:
        """Updates received and not yet handed out."""
        return len(self._queue)

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Listen (once; a second call does nothing).  OSError if the address is taken."""
        if self._runner is not None:
            return
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post(self.path, self._receive)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Answer every waiting request 503 (Telegram keeps the updates) and close."""
        for delivery in [*self._queue, *self._taken]:
            delivery.settle(LATER)
        self._queue.clear()
        self._taken = []
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # -- the bridge's side --------------------------------------------------------

    async def take(self, wait: float) -> list[Any]:
        """The updates received, oldest first, waiting up to WAIT seconds for one.

        A batch taken before and never confirmed is answered 500: Telegram sends it
        again.  Cancelling a take loses nothing (nothing is taken before the wait)."""
        for delivery in self._taken:
            delivery.settle(REDELIVER)
        self._taken = []
        if not self._queue:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait)
            except asyncio.TimeoutError:
                return []
        while self._queue and len(self._taken) < BATCH:
            self._taken.append(self._queue.popleft())
        return [delivery.item for delivery in self._taken]

    def confirm(self) -> None:
        """The last batch taken is kept: answer its requests 200."""
        for delivery in self._taken:
            delivery.settle(KEPT)
        self._taken = []

    # -- Telegram's side ----------------------------------------------------------

    async def _receive(self, request: web.Request) -> web.Response:
        """One POST from Telegram (or from someone without the secret)."""
        if not self._authentic(request.headers.get(SECRET_HEADER, "")):
            self._refused()
            return web.Response(status=403)
        if request.content_type != "application/json":
            return web.Response(status=415)
        if (request.content_length or 0) > self.max_body:
            return web.Response(status=413)
        try:
            update = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413)
        except (ValueError, RecursionError):   # not JSON, or nested past the parser's depth
            return web.Response(status=400)
        if not isinstance(update, dict) or type(update.get("update_id")) is not int:
            return web.Response(status=400)
        return web.Response(status=await self._accept(update))

    def _authentic(self, given: str) -> bool:
        """Whether GIVEN is the secret token (compared in constant time)."""
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._secret)

    async def _accept(self, update: dict[str, Any]) -> int:
        """Queue UPDATE for the bridge; the status to answer once it is kept (or not)."""
        if len(self._queue) >= self.max_pending:
            self._full()
            return LATER
        item = None
        with self._unreadable.skipped(f"update {update['update_id']}"):
            item = self._parse(update)
        if item is None:
            return KEPT
        return await self._deliver(item)

    async def _deliver(self, item: Any) -> int:
        """Hand ITEM to `take`; wait (bounded) until it is confirmed."""
        delivery = Delivery(item, asyncio.get_running_loop().create_future())
        self._queue.append(delivery)
        self._arrived.set()
        try:
            return await asyncio.wait_for(asyncio.shield(delivery.answer), self.ack_timeout)
        except asyncio.TimeoutError:
            return REDELIVER
        finally:
            if not delivery.answer.done() and delivery in self._queue:
                self._queue.remove(delivery)   # answered 500: Telegram sends it again
