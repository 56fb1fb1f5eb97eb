"""Budgets (issue 15): per session and per owner, enforced before the model is called."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from opencortex.config import load_config
from opencortex.events import chat_message
from opencortex.llm import ScriptBackend, Usage
from opencortex.llm.routing import choose_model
from opencortex.llm.settings import LLMSettings
from opencortex.runtime import build_kernel

from conftest import AnsweringApprover, RecordingActuator

GUEST_REPLY = '(:type :REQUEST :target :telegram :chat-id "42" :text "hello")'
CLI_REPLY = '(:type :REQUEST :target :cli :text "hello")'


class FixedUsage(ScriptBackend):
    """The script backend, each reply costing TOKENS tokens; keeps every request."""

    def __init__(self, path: Path, tokens: int):
        super().__init__(path)
        self.tokens = tokens
        self.requests = []

    async def stream(self, request):
        self.requests.append(request)
        async for item in super().stream(request):
            if isinstance(item, Usage):
                item = item.model_copy(update={"input_tokens": self.tokens - 10,
                                               "output_tokens": 10})
            yield item


def home_with(home: Path, budget: str) -> Path:
    (home / "config.toml").write_text(budget)
    return home


def kernel_for(home: Path, tmp_path: Path, reply: str, tokens: int = 450, turns: int = 10):
    path = tmp_path / "replies.jsonl"
    path.write_text("\n".join(json.dumps(reply) for _ in range(turns)) + "\n")
    backend = FixedUsage(path, tokens)
    printed: list[str] = []
    kernel = build_kernel(load_config(home), backend=backend, writer=printed.append)
    frontends = RecordingActuator("telegram")
    kernel.actuators.register(frontends)
    return kernel, backend, frontends, printed


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


GUEST_BUDGET = "[budget]\nshort_at = 0.8\nshort_max_tokens = 100\n[budget.guest]\nsession_tokens = 1000\n"


def test_a_guest_budget_goes_short_once_then_refuses_with_the_renewal_even_after_restart(
        home, tmp_path):
    home_with(home, GUEST_BUDGET)

    async def go():
        kernel, backend, frontends, _ = kernel_for(home, tmp_path, GUEST_REPLY)
        try:
            results = [await kernel.handle(chat_message(f"hi {n}", "telegram", "42"))
                       for n in range(4)]
            return results, backend.requests, frontends.delivered
        finally:
            await kernel.aclose()

    results, requests, delivered = run(go())
    assert [r.status for r in results[:3]] == ["done", "done", "done"]
    assert [r.routing.get("tier") for r in requests] == [None, None, "short"]
    assert requests[2].routing["max_tokens"] == "100"
    notices = [text for _, text in delivered if "Budget nearly used" in text]
    assert len(notices) == 1 and "900 of 1,000 tokens" in notices[0]
    assert results[3].status == "failed" and len(requests) == 3     # never reached the model
    assert "RATE_LIMITED" in results[3].errors[0] and "renews at" in results[3].errors[0]
    assert 0 < results[3].retry_after_seconds <= 86400   # until the renewal, for the wire

    async def after_restart():
        kernel, backend, _, _ = kernel_for(home, tmp_path, GUEST_REPLY)
        try:
            result = await kernel.handle(chat_message("again", "telegram", "42"))
            shown = await kernel.run_command(result.thread, "/budget")
            return result, backend.requests, shown
        finally:
            await kernel.aclose()

    result, requests, shown = run(after_restart())
    assert "RATE_LIMITED" in result.errors[0] and requests == []
    assert "this chat: 1,350 of 1,000 tokens used (100%)" in shown and "guest" in shown


def test_a_new_day_renews_a_daily_budget(home, tmp_path):
    home_with(home, GUEST_BUDGET)

    async def go():
        kernel, backend, _, _ = kernel_for(home, tmp_path, GUEST_REPLY, tokens=2000)
        now = [1_800_000_000.0]
        kernel.budgets.clock = lambda: now[0]
        try:
            first = await kernel.handle(chat_message("one", "telegram", "42"))
            refused = await kernel.handle(chat_message("two", "telegram", "42"))
            now[0] += 86_400
            renewed = await kernel.handle(chat_message("three", "telegram", "42"))
            return first, refused, renewed
        finally:
            await kernel.aclose()

    first, refused, renewed = run(go())
    assert first.status == "done" and refused.status == "failed"
    assert "2027-01-16 00:00 UTC" in refused.errors[0]
    assert renewed.status == "done", renewed.errors


def test_the_owner_is_asked_to_extend_a_used_budget(home, tmp_path):
    home_with(home, "[budget]\nextend_by = 5000\n[budget.developer]\nowner_tokens = 500\n")

    async def go(how):
        kernel, backend, _, _ = kernel_for(home, tmp_path, CLI_REPLY, tokens=600)
        approver = kernel.approvers["cli"] = AnsweringApprover(how)
        try:
            results = [await kernel.handle(chat_message(f"hi {n}")) for n in range(2)]
            return results, approver.asked, len(backend.requests)
        finally:
            await kernel.aclose()

    results, asked, calls = run(go("denied"))
    assert results[0].status == "done" and results[1].status == "failed"
    assert asked[0].action_class == "budget" and "5,000 tokens" in asked[0].title
    assert "owner local: 600 of 500 tokens" in asked[0].action
    assert "RATE_LIMITED" in results[1].errors[0] and "denied" in results[1].errors[0]
    assert calls == 1
    results, asked, calls = run(go("approved"))          # same home: still used up
    assert [r.status for r in results] == ["done", "done"] and len(asked) == 1


def test_budget_without_a_configured_budget_says_none_applies_and_opens_no_store(config, home):
    async def go():
        kernel = build_kernel(config)
        try:
            return await kernel.run_command(chat_message("x").thread, "/budget")
        finally:
            await kernel.aclose()

    assert run(go()) == "No budget applies to this chat (developer)."
    assert not (home / "budgets.sqlite").exists()


def test_the_collapse_of_a_session_is_announced_before_it_happens(home, tmp_path):
    home_with(home, "[conversation]\nmax_turns = 3\n")

    async def go():
        kernel, _, _, printed = kernel_for(home, tmp_path, CLI_REPLY)
        try:
            results = [await kernel.handle(chat_message(f"hi {n}")) for n in range(4)]
            return results, printed
        finally:
            await kernel.aclose()

    results, printed = run(go())
    notices = [text for text in printed if "nearly at its limit" in text]
    assert len(notices) == 1 and "1 of 3 turns" in notices[0]
    assert notices[0] in results[1].warnings
    assert results[3].status == "failed" and "collapsed" in results[3].errors[0]


def test_the_short_tier_picks_its_model_table_row_and_caps_the_output():
    settings = LLMSettings()
    normal = choose_model(settings, "anthropic", "x", {"archetype": "developer"})
    short = choose_model(settings, "anthropic", "x", {"archetype": "developer",
                                                      "tier": "short", "max_tokens": "200"})
    assert normal.model == "claude-opus-4-7" and normal.max_tokens == 4096
    assert short.model == "claude-haiku-4-5" and short.max_tokens == 200


def test_counting_never_waits_for_the_disk_and_close_writes_everything(tmp_path,
                                                                       monkeypatch):
    """Charges count in memory at once; the store's own thread writes them, in order,
    and `close` waits for that: a held disk holds up nobody who counts."""
    import threading
    from opencortex.budget_store import BudgetStore, Used
    release = threading.Event()
    real = BudgetStore._write

    def held(self, *args):
        assert release.wait(20), "the test never released the disk"
        real(self, *args)
    monkeypatch.setattr(BudgetStore, "_write", held)
    store = BudgetStore(tmp_path / "budgets.sqlite")
    store.charge("session:cli:local", "always", 100, 0.5)
    store.charge("session:cli:local", "always", 20, 0.25)
    store.grant("session:cli:local", "always", 1000)
    store.mark_announced("session:cli:local", "always")
    store.mark_announced("session:cli:local", "always")
    assert store.used("session:cli:local", "always") == Used(120, 0.75, 1000, True)
    release.set()
    store.close()
    again = BudgetStore(tmp_path / "budgets.sqlite")
    assert again.used("session:cli:local", "always") == Used(120, 0.75, 1000, True)
    assert again.used("owner:nobody", "always") == Used()
    again.close()


def rows_on_disk(path: Path) -> list[tuple[str, str]]:
    import sqlite3
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT key, period FROM usage"))


def test_old_daily_rows_are_pruned_in_memory_and_on_disk(tmp_path):
    from opencortex.budget_store import BudgetStore, Used
    path = tmp_path / "budgets.sqlite"
    store = BudgetStore(path)
    for day in ("2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23"):
        store.charge("session:telegram:42", day, 10, 0.0)
        store.charge("owner:telegram:42", day, 10, 0.0)
    store.charge("owner:telegram:42", "always", 5, 0.0)
    assert store.prune("2026-11-22") == 4 and store.rows() == 5
    assert store.used("owner:telegram:42", "2026-11-21") == Used()
    assert store.used("owner:telegram:42", "2026-11-22").tokens == 10
    store.close()
    assert [period for _, period in rows_on_disk(path)] == [
        "2026-11-22", "2026-11-23", "always", "2026-11-22", "2026-11-23"]
    again = BudgetStore(path, keep_from="2026-11-23")          # pruned before reading
    assert again.rows() == 3 and rows_on_disk(path) == [
        ("owner:telegram:42", "2026-11-23"), ("owner:telegram:42", "always"),
        ("session:telegram:42", "2026-11-23")]
    again.close()


def test_strangers_chatting_day_after_day_keep_the_store_bounded(home, tmp_path):
    home_with(home, GUEST_BUDGET)

    async def go():
        kernel, _, _, _ = kernel_for(home, tmp_path, GUEST_REPLY, tokens=20, turns=80)
        now = [1_800_000_000.0]
        kernel.budgets.clock = lambda: now[0]
        most = 0
        try:
            for day in range(10):
                for stranger in range(3):
                    await kernel.handle(chat_message("hi", "telegram", f"{day}{stranger}"))
                most = max(most, kernel.budgets.store.rows())
                now[0] += 86_400
            return most, kernel.budgets.store.rows()
        finally:
            await kernel.aclose()

    most, last = run(go())
    assert most == last == 2 * 3              # today's and yesterday's chats only
    periods = [period for _, period in rows_on_disk(home / "budgets.sqlite")]
    assert periods == ["2027-01-23"] * 3 + ["2027-01-24"] * 3   # 24 earlier rows are gone
