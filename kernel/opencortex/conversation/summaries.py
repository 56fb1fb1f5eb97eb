"""Summaries of folded entries: the offline extractive one, and one asked of the LLM.

A `Summarizer` is an async callable ``(entries, max_tokens) -> str``.
`extractive_summarizer` picks the most informative sentences (numbers, code,
names, decisions and frequent content words weigh most; repeats are skipped)
within the allowance, offline and deterministic.  `backend_summarizer` asks an
LLM backend and falls back to the extractive summary when the backend fails.
Whatever a summarizer returns is cut to its allowance by the caller.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from contextlib import aclosing
from typing import Awaitable, Callable, Sequence

from opencortex.conversation.entries import Entry, count_tokens
from opencortex.conversation.similarity import content_words

Summarizer = Callable[[list[Entry], int], Awaitable[str]]


def fit_tokens(text: str, max_tokens: int) -> str:
    """TEXT cut (at the end, marked "…") so that count_tokens says it fits MAX_TOKENS."""
    if count_tokens(text) <= max_tokens:
        return text
    if max_tokens <= 0:
        return ""
    low, high = 0, len(text)  # longest prefix that fits, by bisection (log2 steps)
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(text[:middle].rstrip() + "…") <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + "…" if low else ""


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_DECISION = frozenset("decided decide decision agreed agree chose choose will must should "
                      "need needs plan deadline todo fix use using prefer never always "
                      "important remember".split())
_CODE = re.compile(r"`|\w\(|\)|=|::|->|\w/\w|\w_\w|\{|\}|\[|\]")
REPEAT_OVERLAP = 0.7  # a sentence sharing this much of its words with a chosen one is a repeat
_NAME = re.compile(r"(?<=\s)[A-Z][a-zA-Z]+")


def _overlap(a: set[str], b: set[str]) -> float:
    """Jaccard overlap of two word sets."""
    return len(a & b) / len(a | b) if a and b else 0.0


def _sentence_score(sentence: str, frequency: Counter[str]) -> float:
    words = content_words(sentence)
    if not words:
        return 0.0
    score = sum(frequency[w] for w in set(words)) / (1.0 + math.log(len(words)))
    score += 2.0 * min(3, sum(any(c.isdigit() for c in w) for w in words))
    score += 2.0 if _CODE.search(sentence) else 0.0
    score += 2.0 if _DECISION & set(words) else 0.0
    score += 1.0 * min(3, len(_NAME.findall(sentence)))
    return score


_SUMMARY_HEADER = re.compile(r"^\[Summary of [^\]]*\]\s*")
_SUMMARY_LINE = re.compile(r"^(user|assistant|system)(?: \(turn (\d+)\))?: (.*)$")


def _passages(entries: Sequence[Entry]) -> list[tuple[str, int, str]]:
    """(role, turn, text) for each entry; an earlier summary gives back its own lines."""
    passages: list[tuple[str, int, str]] = []
    for entry in entries:
        if entry.kind != "summary":
            passages.append((entry.role, entry.turn, entry.text))
            continue
        for line in _SUMMARY_HEADER.sub("", entry.text).splitlines():
            match = _SUMMARY_LINE.match(line.strip())
            if match:
                role, turn, text = match.groups()
                passages.append((role, int(turn or 0), text.replace(" … ", "\n")))
            elif line.strip():
                passages.append((entry.role, entry.turn, line))
    return passages


def extract_summary(entries: Sequence[Entry], max_tokens: int) -> str:
    """The most informative sentences of ENTRIES, in their order, within MAX_TOKENS.

    Sentences are scored by the frequency of their content words across all
    the entries, with extra weight for numbers, code, names and decisions.
    One line per passage that contributed: ``user (turn 3): sentence … sentence``;
    an earlier summary among ENTRIES is read back line by line, so summaries
    of summaries stay flat.
    """
    if max_tokens <= 0:
        return ""
    passages = _passages(entries)
    frequency: Counter[str] = Counter(w for p in passages for w in content_words(p[2]))
    sentences: list[tuple[float, int, int, str]] = []  # score, passage index, position, text
    for index, (_, _, text) in enumerate(passages):
        for position, raw in enumerate(_SENTENCE_END.split(text)):
            sentence = " ".join(raw.split())
            score = _sentence_score(sentence, frequency) if sentence else 0.0
            if score > 0:
                sentences.append((score, index, position, sentence))
    ranked = sorted(sentences, key=lambda s: (-s[0], s[1], s[2]))

    def prefix(index: int) -> str:
        role, turn, _ = passages[index]
        return f"{role} (turn {turn}): " if turn > 0 else f"{role}: "

    def render(chosen: list[tuple[float, int, int, str]]) -> str:
        lines: dict[int, list[str]] = {}
        for _, index, _, sentence in sorted(chosen, key=lambda s: (s[1], s[2])):
            lines.setdefault(index, []).append(sentence)
        return "\n".join(prefix(i) + " … ".join(parts) for i, parts in lines.items())

    chosen: list[tuple[float, int, int, str]] = []
    chosen_words: list[set[str]] = []
    used_chars, limit_chars, opened = 0, max_tokens * 4, set()
    for item in ranked:
        cost = len(item[3]) + (3 if item[1] in opened else len(prefix(item[1])) + 1)
        if used_chars + cost > limit_chars:
            continue
        words = set(content_words(item[3]))
        if any(_overlap(words, other) >= REPEAT_OVERLAP for other in chosen_words):
            continue  # says again what a chosen sentence says
        chosen.append(item)
        chosen_words.append(words)
        opened.add(item[1])
        used_chars += cost
    text = render(chosen)
    while chosen and count_tokens(text) > max_tokens:  # the char estimate was off: shed the weakest
        chosen.remove(min(chosen, key=lambda s: s[0]))
        text = render(chosen)
    if not chosen and ranked:
        best = ranked[0]
        text = fit_tokens(prefix(best[1]) + best[3], max_tokens)
    return text


async def extractive_summarizer(entries: list[Entry], max_tokens: int) -> str:
    """The offline summarizer: `extract_summary` as a `Summarizer`, in a worker thread
    (its cost grows with what it folds)."""
    return await asyncio.to_thread(extract_summary, entries, max_tokens)


def on_loop(summarizer: Summarizer, loop: asyncio.AbstractEventLoop) -> Summarizer:
    """SUMMARIZER callable from another thread's event loop too: its calls run on LOOP
    (where a backend's connections live) and are awaited from the caller's."""
    async def summarize(entries: list[Entry], max_tokens: int) -> str:
        if asyncio.get_running_loop() is loop:
            return await summarizer(entries, max_tokens)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(summarizer(entries, max_tokens), loop))
    return summarize


SUMMARY_CHARS_PER_TOKEN = 8   # a summary's reply is read to this many characters a token

SUMMARY_INSTRUCTIONS = (
    "Summarise the conversation excerpt below for your own later reference. Keep every "
    "fact, number, name, decision, constraint and piece of code that may matter later; "
    "drop greetings and small talk. Answer with the summary only, in at most {words} words.")


def backend_summarizer(backend, *, fallback: Summarizer = extractive_summarizer,
                       timeout: float = 120.0) -> Summarizer:
    """A `Summarizer` that asks BACKEND (an `opencortex.llm.base.Backend`) for the summary.

    Falls back to FALLBACK (extractive by default) when the backend fails, answers
    with nothing or takes over TIMEOUT seconds; the reply is cut to the allowance
    either way, and read no further than a reply cut to it could need.
    """
    from opencortex.llm.base import LLMError, PromptMessage, PromptRequest, Usage  # noqa: PLC0415

    async def summarize(entries: list[Entry], max_tokens: int) -> str:
        transcript = "\n\n".join(f"{e.role} (turn {e.turn}): {e.text}" for e in entries)
        request = PromptRequest(
            system=SUMMARY_INSTRUCTIONS.format(words=max(10, max_tokens * 3 // 4)),
            messages=[PromptMessage(role="user", content=transcript or "(empty)")])
        chunks: list[str] = []
        size, enough = 0, max_tokens * SUMMARY_CHARS_PER_TOKEN
        try:
            async with asyncio.timeout(timeout), aclosing(backend.stream(request)) as stream:
                async for item in stream:
                    if isinstance(item, str):
                        chunks.append(item)
                        size += len(item)
                        if size > enough:      # fit_tokens cuts the rest away
                            break
                    elif isinstance(item, Usage) and item.fallback_reason:
                        return await fallback(entries, max_tokens)  # echo stood in
        except (LLMError, TimeoutError):
            return await fallback(entries, max_tokens)
        text = "".join(chunks).strip()
        return fit_tokens(text, max_tokens) if text else await fallback(entries, max_tokens)

    return summarize
