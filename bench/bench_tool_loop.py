"""The tool loop's own cost per step (a script, not a test): prints, asserts nothing.

    python bench/bench_tool_loop.py           # 200 turns each
    python bench/bench_tool_loop.py --quick   # 20 turns each

A script backend (no model) answers each turn with K calls of the clock tool and
then a reply; the per-step overhead is (turn with K steps − turn with none) / K:
judging the call, the policy, running the tool, the progress line, growing the
prompt, archiving the step with its turn.  Also printed: the same for a step that
is put to an (instantly answering) approver.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from figures import percentile
from opencortex.approvals import ApprovalDecision, Approver
from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.llm.script import ScriptBackend
from opencortex.runtime import build_kernel

CLOCK = '(:type :REQUEST :target :tool :action :call :tool "clock")'
REPLY = '(:type :REQUEST :target :cli :text "done")'


class Yes(Approver):
    async def ask(self, request) -> ApprovalDecision:
        return ApprovalDecision("approved")


def turn_times(steps: int, turns: int, *, asked: bool) -> list[float]:
    """Seconds per turn for TURNS turns of STEPS clock calls each."""
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "replies.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in ([CLOCK] * steps + [REPLY]) * turns))
        if asked:
            (Path(home) / "config.toml").write_text('[approvals]\ntools = { clock = "ask" }\n')
        kernel = build_kernel(load_config(home), backend=ScriptBackend(path),
                              writer=lambda text: None)
        kernel.approvers["cli"] = Yes()
        times: list[float] = []

        async def run() -> None:
            for number in range(turns):
                started = time.perf_counter()
                result = await kernel.handle(chat_message(f"turn {number}"))
                times.append(time.perf_counter() - started)
                assert result.status == "done", result.errors
            await kernel.aclose()
        asyncio.run(run())
        return times[len(times) // 10:]   # the first turns warm caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    turns, steps = (20, 4) if args.quick else (200, 8)
    base = turn_times(0, turns, asked=False)
    looped = turn_times(steps, turns, asked=False)
    asked = turn_times(steps, turns, asked=True)
    p50 = statistics.median
    print(f"turn without steps: p50 {1000 * p50(base):.2f} ms, "
          f"p99 {1000 * percentile(base, 0.99):.2f} ms")
    print(f"turn with {steps} steps: p50 {1000 * p50(looped):.2f} ms, "
          f"p99 {1000 * percentile(looped, 0.99):.2f} ms")
    print(f"per-step overhead (allowed): {1000 * (p50(looped) - p50(base)) / steps:.2f} ms")
    print(f"per-step overhead (asked, answered at once): "
          f"{1000 * (p50(asked) - p50(base)) / steps:.2f} ms")


if __name__ == "__main__":
    main()
