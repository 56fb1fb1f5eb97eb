"""OpenTelemetry spans and metrics for turns, optional (`opencortex-kernel[otel]`).

`[telemetry] enabled = true` turns it on; then the kernel reports, through
the OpenTelemetry API (exported by whatever SDK the process configured):

spans    chat.turn (thread, channel, skill, status, attempts, tokens in/out, cost),
         chat.context_render, chat.recall, llm.stream (backend, model, first-chunk
         latency), verify (status), actuate (target), approval.wait (class, outcome)
metrics  chat_turns_total, chat_tokens_per_turn, chat_context_utilization,
         chat_active_sessions, chat_llm_fallback_total, chat_rejections_total,
         approvals_total (by outcome)

Attributes are kernel facts only: never message text, prompts, replies, error
messages or keys.  Off (the default), `Telemetry` does nothing and
`opentelemetry` is never imported.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict


class TelemetrySettings(BaseModel):
    """The `[telemetry]` table."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False


class _NoSpan:
    """A span that records nothing."""

    def set(self, **attributes: Any) -> None:
        """Set attributes (ignored)."""


NO_SPAN = _NoSpan()


class Telemetry:
    """Telemetry switched off: every call does nothing, at no cost."""

    enabled = False

    @contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A span NAME around the block; `.set(**attrs)` adds attributes."""
        yield NO_SPAN

    def count(self, metric: str, amount: float = 1, **attributes: Any) -> None:
        """Add AMOUNT to a counter (or up-down counter) METRIC."""

    def measure(self, metric: str, value: float, **attributes: Any) -> None:
        """Record VALUE in the histogram METRIC."""


class _Span:
    """An OpenTelemetry span behind the `.set` interface; None values are left out."""

    def __init__(self, span: Any):
        self._span = span

    def set(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            if value is not None:
                self._span.set_attribute(key, value)


COUNTERS = ("chat_turns_total", "chat_llm_fallback_total", "chat_rejections_total",
            "approvals_total")
HISTOGRAMS = {"chat_tokens_per_turn": "{token}", "chat_context_utilization": "1"}
UP_DOWN = ("chat_active_sessions",)


class OpenTelemetry(Telemetry):
    """Telemetry through the OpenTelemetry API (imported here, only when enabled)."""

    enabled = True

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None):
        from opentelemetry import metrics, trace
        self._tracer = trace.get_tracer("opencortex", tracer_provider=tracer_provider)
        meter = metrics.get_meter("opencortex", meter_provider=meter_provider)
        self._instruments: dict[str, Any] = {}
        for name in COUNTERS:
            self._instruments[name] = meter.create_counter(name)
        for name, unit in HISTOGRAMS.items():
            self._instruments[name] = meter.create_histogram(name, unit=unit)
        for name in UP_DOWN:
            self._instruments[name] = meter.create_up_down_counter(name)

    @contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        # Exceptions are not recorded: their messages may quote what a person wrote.
        with self._tracer.start_as_current_span(name, record_exception=False,
                                                set_status_on_exception=False) as span:
            handle = _Span(span)
            handle.set(**attributes)
            yield handle

    def count(self, metric: str, amount: float = 1, **attributes: Any) -> None:
        self._instruments[metric].add(amount, attributes)

    def measure(self, metric: str, value: float, **attributes: Any) -> None:
        self._instruments[metric].record(value, attributes)


def telemetry_for(settings: TelemetrySettings) -> Telemetry:
    """OpenTelemetry when enabled (ValueError naming the extra if it is missing), else off."""
    if not settings.enabled:
        return Telemetry()
    try:
        return OpenTelemetry()
    except ImportError:
        raise ValueError("[telemetry] enabled = true needs OpenTelemetry: pip install "
                         "'opencortex-kernel[otel]'") from None


def turn_attributes(result: Any) -> dict[str, Any]:
    """The chat.turn attributes of a finished TurnResult (figures and names only)."""
    usage = result.usage
    return {"thread": str(result.thread), "channel": result.thread.channel,
            "skill": result.skill, "status": result.status, "attempts": result.attempts,
            "tokens_in": usage.input_tokens if usage else 0,
            "tokens_out": usage.output_tokens if usage else 0,
            "cost_usd": usage.cost_usd if usage else None}


def finish_turn(telemetry: Telemetry, span: Any, result: Any) -> None:
    """Close a turn's books: its span attributes and the per-turn metrics."""
    if not telemetry.enabled:
        return
    attributes = turn_attributes(result)
    span.set(**attributes)
    telemetry.count("chat_turns_total", channel=attributes["channel"], status=result.status)
    telemetry.measure("chat_tokens_per_turn",
                      attributes["tokens_in"] + attributes["tokens_out"],
                      channel=attributes["channel"])
    if result.usage is not None and result.usage.fallback_reason:
        telemetry.count("chat_llm_fallback_total", backend=result.backend)


@contextmanager
def turn_span(telemetry: Telemetry, result: Any) -> Iterator[Any]:
    """The chat.turn span around one turn, counting it as active while it runs."""
    if not telemetry.enabled:
        yield NO_SPAN
        return
    with telemetry.span("chat.turn") as span:
        telemetry.count("chat_active_sessions", 1)
        try:
            yield span
        finally:
            telemetry.count("chat_active_sessions", -1)
            finish_turn(telemetry, span, result)
