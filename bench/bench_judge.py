"""Judging benchmark (a script, not a test): prints figures, asserts nothing.

    python bench/bench_judge.py            # 10 KB, 100 KB and 1 MiB hostile shapes
    python bench/bench_judge.py --quick    # 10 KB only, one run each (a few seconds)

Figures, with the bundled skills loaded and the default tools, as a turn judges:
- a typical ~500-byte Emacs reply: read and judge, p50 over many runs;
- hostile shapes at each size: a list of numbers in :cmd, bare symbols, deep
  nesting (groups just under the depth cap), many unknown keys, one long string
  full of escapes.  For each: read time, judge time (reading included), the
  verdict, how many errors it carries and their total size in bytes (the re-ask
  reason is built from them; target: a few KB whatever the input).
  The table is printed twice: with the reader's element cap (10,000, what a
  turn uses: big hostile shapes are refused early), then with the cap lifted,
  which shows the cost of reading and typing every element.
Target: judge time linear in the reply's size (1 MiB ~ 100 x 10 KB).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.reader import ReadError, read_reply
from opencortex.runtime import load_skills
from opencortex.skills import SkillContext
from opencortex.tools import default_tools
from opencortex.verification import judge

TYPICAL = ('(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*opencortex-chat*" '
           ':text "* Reply\\nThe kernel reads this plist as data, checks it against typed '
           'action models and every skill\'s verifier, and only then lets an actuator insert it '
           'into the chat buffer. Nothing in it is ever evaluated; a quote \\" or a backslash '
           '\\\\ stays text. This sentence pads the reply to about five hundred bytes, which is '
           'a typical answer of a chat model asked a short question.")')

KIB = 1024
SIZES = {"10 KB": 10 * KIB, "100 KB": 100 * KIB, "1 MiB": KIB * KIB - 64}


def repeated(head: str, unit: Callable[[int], str], tail: str, size: int) -> str:
    """HEAD, then UNIT(0), UNIT(1), ... space-separated, then TAIL: about SIZE bytes."""
    parts, used, i = [head], len(head) + len(tail), 0
    while True:
        piece = unit(i)
        if used + len(piece) + 1 > size:
            break
        parts.append(piece)
        used += len(piece) + 1
        i += 1
    return " ".join(parts) + tail


def numbers_in_cmd(size: int) -> str:
    """A shell request whose :cmd is a list of numbers (one type error each)."""
    return repeated("(:type :REQUEST :target :shell :cmd (", str, "))", size)


def bare_symbols(size: int) -> str:
    """A terminal reply carrying a list of bare symbols in an unknown key."""
    return repeated('(:type :REQUEST :target :cli :text "x" :junk (',
                    lambda i: f"s{i}", "))", size)


def deep_nesting(size: int) -> str:
    """Many groups nested 60 deep (just under the default cap of 64)."""
    group = "(" * 60 + "1" + ")" * 60
    return repeated('(:type :RESPONSE :text "x" :junk (', lambda i: group, "))", size)


def many_keys(size: int) -> str:
    """A reply with thousands of keys no action has."""
    return repeated('(:type :REQUEST :target :cli :text "x"', lambda i: f":k{i} {i}", ")", size)


def long_escaped_string(size: int) -> str:
    """One :text string full of escapes (valid: it is accepted)."""
    head, tail = "(:type :RESPONSE :text \"", "\")"
    body = ("quote \\\" backslash \\\\ newline \\n tab \\t " * (size // 40 + 1))
    return head + body[:size - len(head) - len(tail)].rstrip("\\") + tail


SHAPES = {"numbers in :cmd": numbers_in_cmd, "bare symbols": bare_symbols,
          "deep nesting": deep_nesting, "many keys": many_keys,
          "long escaped string": long_escaped_string}


def context(home: Path) -> tuple[list, SkillContext]:
    """The bundled skills and an Emacs-channel context, as a turn has them."""
    config = load_config(home)
    skills = load_skills(config).skills
    tools = default_tools()
    settings = {"buffer": config.chat.buffer, "allowed-buffers": [],
                "history-chars": config.chat.history_chars}
    ctx = SkillContext(event=chat_message("hi", "emacs", "local"), config=settings,
                       tools=tools.descriptions())
    return skills, ctx


def seconds(function: Callable[[], object], runs: int) -> float:
    """Median seconds of RUNS calls of FUNCTION."""
    spent = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def read_quietly(text: str, max_elements: int) -> None:
    """Read TEXT, ignoring a refusal (hostile shapes may be refused)."""
    try:
        read_reply(text, max_elements=max_elements)
    except ReadError:
        pass


def bench_typical(skills: list, ctx: SkillContext, runs: int) -> None:
    """p50 of reading and judging the typical reply."""
    tools = default_tools()
    verdict = judge(TYPICAL, skills, ctx, tools)
    read_s = seconds(lambda: read_reply(TYPICAL), runs)
    judge_s = seconds(lambda: judge(TYPICAL, skills, ctx, tools), runs)
    print(f"typical {len(TYPICAL.encode())} B reply: read {read_s * 1e6:.0f} us, "
          f"judge {judge_s * 1e6:.0f} us (p50 of {runs}), {verdict.status}")


def bench_hostile(skills: list, ctx: SkillContext, sizes: dict[str, int], runs: int,
                  max_elements: int) -> None:
    """Read and judge time, verdict and error size for each hostile shape and size."""
    tools = default_tools()
    print(f"{'shape':<20} {'size':>7} {'read ms':>9} {'judge ms':>9}  verdict   "
          f"{'errors':>6} {'bytes':>6}")
    for name, make in SHAPES.items():
        for label, size in sizes.items():
            text = make(size)
            read_s = seconds(lambda: read_quietly(text, max_elements), runs)
            started = time.perf_counter()
            verdict = judge(text, skills, ctx, tools, max_elements=max_elements)
            judge_s = time.perf_counter() - started
            errors = sum(len(e.encode("utf-8", "replace")) for e in verdict.errors)
            print(f"{name:<20} {label:>7} {read_s * 1e3:9.1f} {judge_s * 1e3:9.1f}  "
                  f"{verdict.status:<9} {len(verdict.errors):>6} {errors:>6}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 KB only, one run each")
    parser.add_argument("--max-size", choices=list(SIZES), default="1 MiB",
                        help="largest hostile size to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="opencortex-bench-judge-") as home:
        skills, ctx = context(Path(home))
    labels = list(SIZES)[:1] if args.quick else list(SIZES)[:list(SIZES).index(args.max_size) + 1]
    bench_typical(skills, ctx, runs=200 if args.quick else 2000)
    sizes = {label: SIZES[label] for label in labels}
    runs = 1 if args.quick else 3
    print("hostile shapes, element cap 10,000 (as a turn reads them):")
    bench_hostile(skills, ctx, sizes, runs, max_elements=10_000)
    print("hostile shapes, element cap lifted:")
    bench_hostile(skills, ctx, sizes, runs, max_elements=SIZES["1 MiB"])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
