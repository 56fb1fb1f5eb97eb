"""The bridge's actuator: what the kernel says in a bridge chat, split at the platform's
limit, formatted (plain if refused), paced within its limits, a retry-after honoured."""

from __future__ import annotations

import logging

from opencortex.actions import Action
from opencortex.actuators import ActuatorError, MessageActuator, Outcome
from opencortex.bridges.contract import BridgeError, FormattingRejected, Platform
from opencortex.bridges.outbound import Pacer, RetryAfter, split_text, with_retry_after
from opencortex.bridges.render import plain, to_html
from opencortex.events import Event, chat_of

log = logging.getLogger(__name__)


class BridgeActuator(MessageActuator):
    """Says text in a bridge chat: split, formatted (plain if refused), paced, retried."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self.targets = (platform.channel,)
        self.pacer = Pacer(platform.per_chat, platform.per_second)

    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        """Say the reply ACTION; in EVENT's own chat, as the answer to EVENT's message
        (see `Platform.send`)."""
        address = self.message_address(action)
        own = (event.channel, event.chat_id) == (self.platform.channel, address)
        await self.deliver(address, action.text, key,
                           reply_to=event.message_id if own else None)
        return Outcome(shown=action.text)

    async def deliver(self, address: str, text: str, key: str | None = None,
                      reply_to: str | None = None) -> None:
        for number, piece in enumerate(split_text(text, self.platform.text_limit)):
            await self.pacer.wait(chat_of(address))     # a platform paces a chat's topics too
            try:
                await self._send(address, piece, None if key is None else f"{key}/{number}",
                                 reply_to)
            except (BridgeError, RetryAfter) as error:
                raise ActuatorError(f"{self.platform.channel} did not take the message: "
                                    f"{error}") from None

    async def _send(self, chat_id: str, piece: str, key: str | None,
                    reply_to: str | None) -> None:
        """PIECE of a message (KEY, REPLY_TO: see `Platform.send`), as plain text if the
        platform refuses its formatting (a message of a key of its own)."""
        async def formatted() -> None:
            await self.platform.send(chat_id, to_html(piece), plain(piece), key, reply_to)

        async def unformatted() -> None:
            await self.platform.send(chat_id, "", plain(piece),
                                     None if key is None else f"{key}/plain", reply_to)
        try:
            await with_retry_after(formatted)
        except FormattingRejected:
            log.info("%s refused the formatting; sent as plain text", self.platform.channel)
            await with_retry_after(unformatted)
