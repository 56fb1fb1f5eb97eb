"""Benchmark figures for the LLM backends (a script, not a test): prints, asserts nothing.

    python bench/bench_llm.py [--chunks 2000] [--runs 31]
    python bench/bench_llm.py --quick     # a few seconds: 200 chunks, 3 runs

A loopback imitation of each provider (tests/llm_fakes.py, in a process of its
own) streams a reply of N chunks; the same stream is read three ways:
- bare SDK: the official SDK's own streaming loop (`messages.stream().text_stream`,
  `chat.completions.create(stream=True)`), nothing else;
- backend: `make_backend(config).stream(request)` (echo fallback, model table,
  timeouts, retries, usage and cost) — what the kernel iterates;
- kernel turn: `kernel.handle(event)` with a chunk observer — event parsing,
  history, the chat skill's prompt, the backend, and (after the stream) reading,
  verification, actuation and the archive.
All three send the same request: the chat skill's prompt for "hi" (each kernel
turn in a thread of its own with recall off, so the prompt does not grow from
turn to turn).  The fake sends each reply in one write
(so the client, not the server, sets the pace) and the garbage collector is
paused during each read, as timeit does.  The readers take turns; figures are
the best of the runs (as timeit advises: slower runs measure other load on the
machine, not the code; the spread of the bare SDK is printed too): time to
first chunk (TTFC), wall-clock time to the end of the reply, and this
process's CPU time for it.  A first line measures the backend's own cost per
chunk with no network and no SDK.  Targets: the kernel adds under 1 ms to TTFC
and under 5 % to a 2,000-chunk stream.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

REPO = Path(__file__).resolve().parents[1]

from opencortex.config import load_config  # noqa: E402
from opencortex.events import chat_message  # noqa: E402
from opencortex.kernel import TurnObserver  # noqa: E402
from opencortex.llm import PromptRequest, make_backend  # noqa: E402
from opencortex.runtime import build_kernel  # noqa: E402

Timing = tuple[float, float, float]  # TTFC, stream (wall clock), stream (CPU of this process)


class Stopwatch:
    """Wall clock and this process's CPU time since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.first = 0.0

    def chunk(self) -> None:
        if not self.first:
            self.first = time.perf_counter() - self.wall

    def timing(self) -> Timing:
        return self.first, time.perf_counter() - self.wall, time.process_time() - self.cpu


def start_server(chunks: int) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "llm_fakes.py"),
                               "--chunks", str(chunks), "--text", "token ", "--plist",
                               "--burst"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def stop_server(server: subprocess.Popen) -> None:
    assert server.stdin is not None
    server.stdin.close()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=10)


async def bare_anthropic(client: Any, params: dict[str, Any]) -> Timing:
    watch = Stopwatch()
    async with client.messages.stream(**params) as stream:
        async for _ in stream.text_stream:
            watch.chunk()
        await stream.get_final_message()
    return watch.timing()


async def bare_openai(client: Any, params: dict[str, Any]) -> Timing:
    watch = Stopwatch()
    stream = await client.chat.completions.create(**params)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            watch.chunk()
    return watch.timing()


async def kernel_request(kernel: Any) -> PromptRequest:
    """The prompt the kernel's chat skill builds for "hi" on the CLI."""
    event = chat_message("hi", "cli", "bench-prompt")
    conversation = await kernel.conversations.open(event.thread)
    prepared = await kernel.preparation.prepare(event, conversation, kernel.persona)
    return prepared.request


def backend_reader(backend: Any, request: PromptRequest) -> Callable[[], Awaitable[Timing]]:
    async def read() -> Timing:
        watch = Stopwatch()
        async for item in backend.stream(request):
            if item.__class__ is str:
                watch.chunk()
        return watch.timing()
    return read


class Clock(TurnObserver):
    """Follows a kernel turn: first chunk, and the end of the model's reply."""

    def __init__(self) -> None:
        self.watch = Stopwatch()
        self.done: Timing = (0.0, 0.0, 0.0)

    def on_chunk(self, text: str) -> None:
        self.watch.chunk()

    def on_reply_done(self) -> None:
        self.done = self.watch.timing()


def kernel_reader(kernel: Any, turns: list[float]) -> Callable[[], Awaitable[Timing]]:
    async def read() -> Timing:
        clock = Clock()
        thread = f"bench-{len(turns)}"  # a fresh thread: no history, the same prompt
        result = await kernel.handle(chat_message("hi", "cli", thread), clock)
        turns.append(time.perf_counter() - clock.watch.wall)
        if result.status != "done":
            raise SystemExit(f"kernel turn failed: {result.errors}")
        return clock.done
    return read


async def interleaved(readers: list[Callable[[], Awaitable[Timing]]],
                      runs: int, warm: int = 3) -> tuple[list[Timing], float]:
    """The best (TTFC, stream, CPU) of each reader over RUNS, after WARM unmeasured
    reads each (SDK import, connection, caches); the readers take turns."""
    for read in readers:
        for _ in range(warm):
            await read()
    timings: list[list[Timing]] = [[] for _ in readers]
    for _ in range(runs):
        for read, seen in zip(readers, timings):
            gc.collect()
            gc.disable()  # as timeit does: collector pauses are noise here
            try:
                seen.append(await read())
            finally:
                gc.enable()
    best = [tuple(min(t[i] for t in seen) for i in range(3)) for seen in timings]
    return best, noise(timings[0])  # type: ignore[return-value]


def noise(timings: list[Timing]) -> float:
    """Half the interquartile range of the stream times, as a fraction of their median."""
    low, middle, high = statistics.quantiles([t[1] for t in timings], n=4)
    return (high - low) / 2 / middle


async def bench(kind: str, port: int, chunks: int, runs: int, home: Path) -> None:
    url = f"http://127.0.0.1:{port}"
    os.environ["ANTHROPIC_API_KEY"] = os.environ["OPENAI_API_KEY"] = "bench-key"
    os.environ["ANTHROPIC_BASE_URL"], os.environ["OPENAI_BASE_URL"] = url, f"{url}/v1"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[conversation]\nrecall_k = 0\n")  # same request each turn
    config = load_config(home, backend=kind)
    backend = make_backend(config)
    turns: list[float] = []
    kernel = build_kernel(config, writer=lambda text: None)
    request = await kernel_request(kernel)
    params = backend.primary.request_params(request, backend.primary.choice_for(request))
    if kind == "anthropic":
        import anthropic
        client: Any = anthropic.AsyncAnthropic(api_key="bench-key", base_url=url,
                                               max_retries=0)
        bare_read = bare_anthropic
    else:
        import openai
        client = openai.AsyncOpenAI(api_key="bench-key", base_url=f"{url}/v1", max_retries=0)
        bare_read = bare_openai
    (bare, through_backend, through_kernel), spread = await interleaved(
        [lambda: bare_read(client, params), backend_reader(backend, request),
         kernel_reader(kernel, turns)], runs, warm=1 if runs < 10 else 3)
    await client.close()
    await backend.aclose()
    await kernel.aclose()
    print(f"{kind}: {chunks} chunks, best of {runs} runs")
    print(f"  {'':<12} {'TTFC ms':>8} {'+TTFC ms':>9} {'stream ms':>10} {'+stream':>8} "
          f"{'CPU ms':>8} {'+CPU µs/chunk':>14} {'+CPU':>6}")
    for label, (first, total, cpu) in (("bare SDK", bare), ("backend", through_backend),
                                       ("kernel turn", through_kernel)):
        print(f"  {label:<12} {first * 1e3:>8.3f} {(first - bare[0]) * 1e3:>9.3f} "
              f"{total * 1e3:>10.2f} {(total / bare[1] - 1) * 100:>7.1f}% "
              f"{cpu * 1e3:>8.2f} {(cpu - bare[2]) / chunks * 1e6:>14.2f} "
              f"{(cpu / bare[2] - 1) * 100:>5.1f}%")
    print(f"  whole kernel turn (stream + read + verify + act + archive): "
          f"{statistics.median(turns[-runs:]) * 1e3:.2f} ms; the bare SDK's stream time varies "
          f"±{spread * 100:.1f} % between its quartiles")


async def machinery(chunks: int = 200_000) -> None:
    """The backend's own cost per chunk, without network or SDK: a provider whose
    stream is an in-memory generator, against iterating that generator bare."""
    from opencortex.llm import EchoFallback, Usage
    from opencortex.llm.provider import ProviderBackend
    from opencortex.llm.settings import LLMSettings

    async def source() -> Any:
        for _ in range(chunks):
            yield "x"
        yield Usage(model="m")

    class InMemory(ProviderBackend):
        name, sdk_module = "in-memory", "json"

        def _new_client(self, api_key: str | None) -> Any:
            return None

        def _events(self, client: Any, request: PromptRequest, choice: Any) -> Any:
            return source()

        def _classify(self, error: Exception, model: str) -> None:
            return None

    async def cpu(stream: Any) -> float:
        started = time.process_time()
        async for item in stream:
            if item.__class__ is str:
                pass
        return time.process_time() - started

    request = PromptRequest(messages=[{"role": "user", "content": "hi"}])
    backend = EchoFallback(InMemory(LLMSettings(), api_key="k", base_url="memory",
                                    key_variable="KEY", default_model="m"))
    bare = min([await cpu(source()) for _ in range(5)])
    ours = min([await cpu(backend.stream(request)) for _ in range(5)])
    print(f"backend machinery without network (fallback, model choice, stall watchdog, "
          f"usage): {(ours - bare) / chunks * 1e6:.2f} µs a chunk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="200 chunks, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.runs = 200, 3
    asyncio.run(machinery(20_000 if args.quick else 200_000))
    server, port = start_server(args.chunks)
    try:
        with tempfile.TemporaryDirectory() as home:
            for kind in ("anthropic", "openai"):
                asyncio.run(bench(kind, port, args.chunks, args.runs, Path(home) / kind))
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
