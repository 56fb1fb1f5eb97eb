"""Echo stands in when the configured provider cannot be reached, and says so every time.

Only a provider that could not be reached before any text arrived is replaced
(connection refused, DNS, connect timeout, 5xx after the retries, a missing key):
the echo reply then carries the reason in its text, `Usage.fallback_reason`
repeats it for `--json` and status lines, and a log line records it (without
message content).  Rate limits, timeouts, refused keys, invalid requests and
streams cut midway stay errors: echo would hide what the person has to fix.
"""

from __future__ import annotations

import logging
from typing import AsyncIterator

from opencortex.llm.base import Backend, PromptRequest, Usage
from opencortex.llm.echo import EchoBackend
from opencortex.llm.failures import ProviderUnreachable

log = logging.getLogger(__name__)


class EchoFallback(Backend):
    """PRIMARY, or echo with a notice when PRIMARY is unreachable."""

    def __init__(self, primary: Backend, echo: EchoBackend | None = None):
        self.primary = primary
        self.echo = echo or EchoBackend(warning=None)
        self.name = primary.name
        self.warning = primary.warning

    async def stream(self, request: PromptRequest) -> AsyncIterator[str | Usage]:
        try:
            async for item in self.primary.stream(request):
                yield item
            return
        except ProviderUnreachable as unreachable:
            notice = f"{self.name} unavailable: {unreachable.message}; this reply is an echo"
        log.warning("%s unreachable; echo answered this turn", self.name)
        for item in self.echo.reply(request, notice):
            yield item

    def model_for(self, request: PromptRequest) -> str:
        return self.primary.model_for(request)

    async def aclose(self) -> None:
        await self.primary.aclose()
