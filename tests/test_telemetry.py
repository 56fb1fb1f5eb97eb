"""OpenTelemetry (issue 15): spans and metrics carry kernel facts, never what people wrote."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from opencortex.approvals import ApprovalDecision, Approver
from opencortex.events import chat_message
from opencortex.llm import ScriptBackend
from opencortex.runtime import build_kernel
from opencortex.telemetry import OpenTelemetry

from conftest import cli_env

CANARY = "CANARY-7f3a9-do-not-leak"


class Yes(Approver):
    async def ask(self, request):
        return ApprovalDecision("approved")


def everything_recorded(spans, metrics) -> str:
    """Every span name, attribute and event, and every metric name and attribute, as text."""
    seen = []
    for span in spans:
        seen += [span.name, json.dumps(dict(span.attributes or {}), default=str)]
        seen += [f"{event.name} {dict(event.attributes or {})}" for event in span.events]
        seen.append(str(span.status.description))
    for resource in metrics.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                seen.append(metric.name)
                seen += [json.dumps(dict(point.attributes or {}), default=str)
                         for point in metric.data.data_points]
    return "\n".join(seen)


def test_spans_and_metrics_never_carry_message_text_or_replies(config, tmp_path):
    path = tmp_path / "replies.jsonl"
    replies = ["not a plist " + CANARY,                                   # rejected, re-asked
               f'(:type :REQUEST :target :cli :text "{CANARY} reply")',
               f'(:type :REQUEST :target :shell :cmd ("echo" "{CANARY}") :reason "{CANARY}")',
               f'(:type :REQUEST :target :cli :text "{CANARY} ran")']          # after the step
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))

    async def go():
        kernel = build_kernel(config, backend=ScriptBackend(path), writer=lambda _: None)
        telemetry = OpenTelemetry(
            tracer_provider=tracer, meter_provider=MeterProvider(metric_readers=[reader]))
        kernel.telemetry = kernel.actuation.telemetry = kernel.replies.telemetry = telemetry
        kernel.preparation.telemetry = telemetry
        kernel.approvers["cli"] = Yes()
        try:
            first = await kernel.handle(chat_message(f"please say {CANARY}"))
            second = await kernel.handle(chat_message(f"run {CANARY}"))
            return first, second
        finally:
            await kernel.aclose()

    first, second = asyncio.run(asyncio.wait_for(go(), 30))
    assert first.status == "done" and CANARY in (first.text or "")
    assert second.status == "done" and second.attempts == 2   # the command, then the answer
    assert [step.outcome for step in second.steps] == ["done"]
    assert CANARY in second.steps[0].result            # the command's output reached the model
    spans, metrics = exporter.get_finished_spans(), reader.get_metrics_data()
    recorded = everything_recorded(spans, metrics)
    assert CANARY not in recorded
    names = {span.name for span in spans}
    assert {"chat.turn", "chat.context_render", "chat.recall", "llm.stream", "verify",
            "actuate", "approval.wait"} <= names
    turn = next(s for s in spans if s.name == "chat.turn")
    assert turn.attributes["thread"] == "cli:local" and turn.attributes["attempts"] == 2
    assert turn.attributes["status"] == "done" and turn.attributes["tokens_out"] > 0
    stream = next(s for s in spans if s.name == "llm.stream")
    assert stream.attributes["backend"] == "script"
    for metric in ("chat_turns_total", "chat_tokens_per_turn", "chat_context_utilization",
                   "chat_active_sessions", "chat_rejections_total", "approvals_total"):
        assert metric in recorded
    assert '"outcome": "approved"' in recorded


def test_without_telemetry_opentelemetry_is_never_imported(home):
    program = ("import asyncio, sys\n"
               "from opencortex.config import load_config\n"
               "from opencortex.events import chat_message\n"
               "from opencortex.runtime import build_kernel\n"
               "async def go():\n"
               "    kernel = build_kernel(load_config(), writer=lambda _: None)\n"
               "    result = await kernel.handle(chat_message('hi'))\n"
               "    await kernel.aclose()\n"
               "    return result.status\n"
               "status = asyncio.run(go())\n"
               "print(status, any(m.startswith('opentelemetry') for m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=cli_env(home, OPENCORTEX_BACKEND="echo"), timeout=60)
    assert done.stdout.split() == ["done", "False"], done.stderr


def test_enabling_telemetry_in_the_config_uses_opentelemetry(home):
    (home / "config.toml").write_text("backend = \"echo\"\n[telemetry]\nenabled = true\n")
    from opencortex.config import load_config

    async def go():
        kernel = build_kernel(load_config(home), writer=lambda _: None)
        try:
            return kernel.telemetry.enabled, (await kernel.handle(chat_message("hi"))).status
        finally:
            await kernel.aclose()

    assert asyncio.run(go()) == (True, "done")
