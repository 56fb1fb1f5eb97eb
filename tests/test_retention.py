"""Retention (issue 15): forgetting removes messages from the org files and the index together."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from opencortex.conversation.branches import BRANCH, CONTROL
from opencortex.conversation.storedsummaries import FIRST, LAST, STRATEGY, SUMMARY, TURNS
from opencortex.events import Thread, chat_message
from opencortex.llm import ScriptBackend
from opencortex.memory import Archive, NewMessage
from opencortex.memory.retention import TEMP_SUFFIX, count_forgettable, forget
from opencortex.runtime import build_kernel

from conftest import cli_env

T = Thread("telegram", "42")
OTHER = Thread("telegram", "43")


def fill(archive: Archive) -> None:
    for n, when in enumerate([1_000.0, 2_000.0, 3_000.0]):
        archive.append([NewMessage(role="user", text=f"zebra question {n}", thread=T,
                                   timestamp=when),
                        NewMessage(role="assistant", text=f"zebra answer {n}", thread=T,
                                   timestamp=when)])
    archive.append([NewMessage(role="user", text="zebra elsewhere", thread=OTHER)])


def rows(archive: Archive) -> list[tuple]:
    return sorted((r.id, r.text, r.parent) for t in (T, OTHER)
                  for r in archive.thread_records(t))


def test_forgetting_older_messages_keeps_files_and_index_in_agreement(tmp_path):
    with Archive(tmp_path / "memory") as archive:
        fill(archive)
        assert count_forgettable(archive, T, before=2_500.0) == 4
        assert forget(archive, T, before=2_500.0) == 4
        before_reindex = rows(archive)
        texts = [r.text for r in archive.read_thread(T)]
        hits = {h.text for h in archive.search("zebra", limit=50)}
        assert archive.reindex() == 3
        assert rows(archive) == before_reindex
    assert texts == ["zebra question 2", "zebra answer 2"]
    assert hits == {"zebra question 2", "zebra answer 2", "zebra elsewhere"}
    assert not list((tmp_path / "memory").rglob(f"*{TEMP_SUFFIX}"))
    with Archive(tmp_path / "memory") as again:          # a restart reads the same
        assert rows(again) == before_reindex
        again.append([NewMessage(role="user", text="after", thread=T)])
        assert [r.text for r in again.read_thread(T)][-1] == "after"


def summary_of(first: str, last: str, text: str) -> NewMessage:
    """A compression summary record over FIRST..LAST, as storedsummaries writes one."""
    extra = {CONTROL: SUMMARY, BRANCH: "main", STRATEGY: "summarize", TURNS: "1-2",
             FIRST: first, LAST: last}
    return NewMessage(role="system", text=text, thread=T, turn_type="silence", parent=None,
                      extra=extra)


def test_forgetting_older_messages_takes_the_summaries_that_quote_them(tmp_path):
    with Archive(tmp_path / "memory") as archive:
        fill(archive)
        ids = [r.id for r in archive.read_thread(T)]       # q0 a0 (1000) q1 a1 (2000) q2 a2
        archive.append([summary_of(ids[0], ids[3], "[Summary] the zebra question 0"),
                        summary_of(ids[4], ids[5], "[Summary] the zebra question 2")])
        assert forget(archive, T, before=2_500.0) == 4
        text = archive.thread_file(T).read_text()
    assert "the zebra question 0" not in text and "zebra answer 1" not in text
    assert "[Summary] the zebra question 2" in text      # its span is all kept


def test_forgetting_a_whole_thread_removes_its_file_and_rows(tmp_path):
    with Archive(tmp_path / "memory") as archive:
        fill(archive)
        path = archive.thread_file(T)
        assert forget(archive, T) == 6
        assert not path.exists()
        assert archive.thread_records(T) == [] and archive.search("question") == []
        kept = rows(archive)
        archive.reindex()
        assert rows(archive) == kept and len(kept) == 1
        assert forget(archive, T) == 0


def test_slash_forget_counts_asks_then_removes_the_persons_own_thread(config, tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text(json.dumps('(:type :REQUEST :target :cli :text "remembered")') + "\n")

    async def go():
        kernel = build_kernel(config, backend=ScriptBackend(path), writer=lambda _: None)
        try:
            await kernel.handle(chat_message("a secret"))
            thread = Thread("cli", "local")
            asked = await kernel.run_command(thread, "/forget")
            done = await kernel.run_command(thread, "/forget yes")
            view = await kernel.view(thread)
            return asked, done, kernel.archive.thread_records(thread), view
        finally:
            await kernel.aclose()

    asked, done, records, view = asyncio.run(asyncio.wait_for(go(), 30))
    assert "all 2 messages" in asked and "/forget yes" in asked
    assert done.startswith("Forgot 2 messages") and records == [] and view["turn"] == 0


def test_cli_memory_forget_needs_a_yes(home):
    with Archive(home / "memory") as archive:
        fill(archive)
    command = [sys.executable, "-m", "opencortex", "memory", "forget", "--thread", "telegram:42",
               "--before", "1970-01-01T00:40:00"]
    env = cli_env(home)
    refused = subprocess.run(command, input="n\n", capture_output=True, text=True, env=env,
                             timeout=60)
    assert refused.returncode == 1 and "Forget 4 messages" in refused.stdout
    done = subprocess.run([*command, "--yes"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0 and "forgot 4 messages" in done.stdout
    with Archive(home / "memory") as archive:
        assert len(archive.thread_records(T)) == 2
