"""Emacs benchmark (a script, not a test): a real `emacs --batch` over real EPC.

    python bench/bench_emacs.py [--messages 200]
    python bench/bench_emacs.py --quick   # a few seconds: 20 messages, 2 short streams

The kernel runs in this process (so the moment the backend yields a chunk can be
stamped); Emacs connects to it through the connection file, as `M-x
opencortex-connect` does.  Prints:
- message sent in Emacs → reply inserted in the buffer: p50 / p99 (echo backend);
- kernel-side time per turn: p50 / p99;
- first streamed text visible in Emacs after the backend yielded it: p50 / p99
  (target: within 20 ms);
- buffer updates per second during a fast stream (target: at most ~30).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_core import bench_kernel
from figures import percentile
from opencortex.config import load_config
from opencortex.llm import EchoBackend, PromptRequest, Usage
from opencortex.serve import serve

REPO = Path(__file__).resolve().parents[1]

DRIVER = """
(require 'opencortex)
(setq opencortex-wait-timeout 60)
(defvar bench-inserted nil)
(defvar bench-first-chunk nil)
(add-hook 'opencortex-after-insert-hook
          (lambda (beg end)
            (let ((text (buffer-substring-no-properties beg end)))
              (when (string-search "[Echo] message" text)
                (setq bench-inserted (float-time)))
              (when (and (not bench-first-chunk) (string-prefix-p "* S" text))
                (setq bench-first-chunk (float-time))))))
(opencortex-connect {connection})
(unless (opencortex-wait-idle 60) (error "no kernel"))
(opencortex-chat)
(let ((round-trips nil) (firsts nil) (updates nil))
  (dotimes (i {messages})
    (setq bench-inserted nil)
    (let ((sent (float-time)))
      (opencortex-send (format "message %d" i))
      (opencortex-wait-for (lambda () bench-inserted) 30)
      (push (- bench-inserted sent) round-trips)
      (opencortex-wait-idle 30)))
  (dotimes (i {streams})
    (setq bench-first-chunk nil)
    (let ((before opencortex--stream-updates)
          (sent (float-time)))
      (opencortex-send (format "stream %d" i))
      (opencortex-wait-idle 60)
      (push bench-first-chunk firsts)
      (push (list (- opencortex--stream-updates before) (- (float-time) sent)) updates)))
  (with-temp-file {out}
    (insert (json-encode (list (cons 'round_trips (vconcat (nreverse round-trips)))
                               (cons 'firsts (vconcat (nreverse firsts)))
                               (cons 'updates (vconcat (mapcar #'vconcat (nreverse updates)))))))))
(kill-emacs 0)
"""


class TimedBackend(EchoBackend):
    """Echo, stamping when the first chunk is yielded; "stream N" gives a long fast stream."""

    def __init__(self, words: int = 3000) -> None:
        super().__init__(warning=None)
        self.first_yield: list[float] = []
        self.words = words

    async def stream(self, request: PromptRequest):
        said = request.messages[-1].content.rsplit("\n\n", 1)[-1]  # after any recalled block
        if not said.startswith("stream "):
            async for item in super().stream(request):
                yield item
            return
        words = " ".join(f"w{i}" for i in range(self.words))
        form = ('(:type :REQUEST :target :emacs :action :insert-at-end '
                f':buffer "*opencortex-chat*" :text "* Stream\\n{words}")')
        for index in range(0, len(form), 4):
            if index == 0:
                self.first_yield.append(time.time())
            yield form[index:index + 4]
            if index % 64 == 0:
                await asyncio.sleep(0.001)  # a fast model: ~4 characters every ~0.1 ms
        yield Usage(model="timed-echo", estimated=True)


async def run(messages: int, streams: int, words: int = 3000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        config = load_config(tmp_path / "home")
        connection = tmp_path / "kernel.json"
        out = tmp_path / "result.json"
        backend = TimedBackend(words)
        stop = asyncio.Event()
        kernel_task = asyncio.create_task(serve(config, connection_file=connection,
                                                stdout=open("/dev/null", "w"),
                                                backend=backend, stop=stop))
        for _ in range(100):
            if connection.exists():
                break
            await asyncio.sleep(0.05)
        driver = tmp_path / "driver.el"
        driver.write_text(DRIVER.format(connection=json.dumps(str(connection)), out=json.dumps(
            str(out)), messages=messages, streams=streams))
        emacs = await asyncio.create_subprocess_exec(
            "emacs", "--batch", "-L", str(REPO / "elisp"), "-l", str(driver),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(emacs.communicate(), 600)
        stop.set()
        await kernel_task
        if emacs.returncode != 0:
            sys.exit(f"emacs failed: {stderr.decode()[-2000:]}")
        result = json.loads(out.read_text())
    trips = [t * 1000 for t in result["round_trips"]]
    print(f"Emacs → kernel (echo) → reply inserted, {len(trips)} messages: "
          f"p50 {percentile(trips, .5):.2f} ms  p99 {percentile(trips, .99):.2f} ms")
    firsts = [(seen - yielded) * 1000 for seen, yielded in zip(result["firsts"],
                                                                backend.first_yield)]
    print(f"first streamed text visible after the backend yielded it, {len(firsts)} streams: "
          f"p50 {percentile(firsts, .5):.2f} ms  p99 {percentile(firsts, .99):.2f} ms "
          "(target < 20 ms)")
    rates = [count / seconds for count, seconds in result["updates"]]
    print(f"buffer updates per second during a fast stream: median {statistics.median(rates):.1f}"
          f" (max {max(rates):.1f}; target <= ~30)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="20 messages, 2 streams of 500 words")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.streams = 20, 2
    asyncio.run(run(args.messages, args.streams, 500 if args.quick else 3000))
    print("kernel-side time per turn:")
    bench_kernel(30 if args.quick else 300)


if __name__ == "__main__":
    main()
