"""The Telegram bridge: the real python-telegram-bot against a loopback fake Bot API."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from opencortex.bridges import service
from opencortex.bridges.settings import TelegramSettings
from opencortex.bridges.telegram import TelegramPlatform
from opencortex.events import Thread

from bridge_helpers import odd_item_skipped, run, running_bridge, script, until
from telegram_fake import BOT_NAME, FakeBotApi

TOKEN = "4242:AAE-canary-token-never-logged"
OWNER, STRANGER, FRIEND = 7, 666, 8
GROUP = -1001


@asynccontextmanager
async def bridge(home: Path, backend=None, owners=None, **settings):
    fake = FakeBotApi(TOKEN)
    url = await fake.start()
    options = {"allow": [str(OWNER), str(FRIEND)], "poll_timeout": 1, **settings}
    tg = TelegramSettings(enabled=True, base_url=url, **options)
    try:
        async with running_bridge(home, TelegramPlatform(tg, TOKEN), tg, backend=backend,
                                  owners=owners) as (running, kernel):
            yield fake, running, kernel
    finally:
        await fake.stop()


def texts(fake, chat) -> list[str]:
    return [s.text for s in fake.sent if s.chat_id == str(chat)]


def test_owner_is_answered_and_a_stranger_gets_one_refusal_and_nothing_else(home, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(service, "TYPING_AFTER", 0.0)   # echo answers before it otherwise

    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            fake.send(STRANGER, "secret stranger words")
            fake.send(STRANGER, "more stranger words")
            fake.send(OWNER, "hello *there*")
            await until(lambda: texts(fake, OWNER))
            await asyncio.sleep(0.3)
            assert texts(fake, OWNER) == ["[Echo] hello <b>there</b>"]
            assert fake.sent[-1].parse_mode == "HTML"
            assert texts(fake, STRANGER) == ["Sorry, this is a private assistant."]
            assert (str(OWNER), "typing") in fake.actions
            assert running.gate.counts["stranger"] == 2
            assert {c["command"] for c in fake.commands} >= {"help", "history", "reset"}
            threads = {str(t) for t in kernel.archive.threads()}
            assert threads == {f"telegram:{OWNER}"}
    run(scenario())
    assert "stranger words" not in caplog.text
    assert TOKEN not in caplog.text


def test_groups_answer_only_allowed_groups_when_addressed(home):
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, running, _):
            fake.send(OWNER, "no mention", chat_id=GROUP, chat_type="supergroup")
            fake.send(OWNER, f"@{BOT_NAME} hi", chat_id=GROUP, chat_type="supergroup")
            fake.send(OWNER, "a reply", chat_id=GROUP, chat_type="supergroup",
                      reply_to_bot=True)
            fake.send(STRANGER, f"@{BOT_NAME} hi", chat_id=GROUP, chat_type="supergroup")
            fake.send(OWNER, f"@{BOT_NAME} hi", chat_id=-2002, chat_type="group")
            await until(lambda: len(texts(fake, GROUP)) == 2)
            await asyncio.sleep(0.3)
            assert len(texts(fake, GROUP)) == 2 and not texts(fake, -2002)
            assert running.gate.counts["group-not-addressed"] == 1
    run(scenario())


def test_a_group_members_display_name_is_archived_and_names_them_for_recall(home):
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, running, kernel):
            fake.send(FRIEND, f"@{BOT_NAME} my locker code is 4711", chat_id=GROUP,
                      chat_type="supergroup")
            fake.send(OWNER, f"@{BOT_NAME} user8, what is your locker code again?",
                      chat_id=GROUP, chat_type="supergroup")
            await until(lambda: len(texts(fake, GROUP)) == 2)
            thread = Thread("telegram", str(GROUP))
            said = {r.text.split("} ", 1)[-1]: r for r in kernel.archive.read_thread(thread)
                    if r.role == "user"}
            friend = next(r for t, r in said.items() if t.endswith("4711"))
            assert (friend.sender, friend.extra["SENDER_NAME"]) == (str(FRIEND), "user8")
            assert kernel.archive.speakers("what is user8's code", threads=[thread]) == \
                ["user8"]
            recall = kernel.conversations.recall
            [best, *_] = recall.recall(thread, "what is user8's locker code", k=2)
            assert best.id == friend.id
    run(scenario())


def test_a_long_reply_is_split_under_the_limit(home, tmp_path):
    long = "\n\n".join(f"Paragraph {i}. " + "word " * 150 for i in range(12))
    reply = f'(:type :REQUEST :target :telegram :chat-id "{OWNER}" :text "{long}")'

    async def scenario():
        async with bridge(home, script(tmp_path, reply)) as (fake, _, _):
            fake.send(OWNER, "tell me a lot")
            await until(lambda: sum(len(t) for t in texts(fake, OWNER)) >= len(long) - 50)
            pieces = texts(fake, OWNER)
            assert len(pieces) >= 2 and all(len(p) <= 4096 for p in pieces)
            assert all(p.startswith("Paragraph") for p in pieces)
    run(scenario())


def test_formatting_refused_falls_back_to_plain_and_429_is_honoured(home):
    async def scenario():
        async with bridge(home) as (fake, _, _):
            fake.fail("sendMessage", "429", "parse")
            fake.send(OWNER, "*bold* <tag>")
            await until(lambda: texts(fake, OWNER), 20)
            sent = [s for s in fake.sent if s.chat_id == str(OWNER)][0]
            assert sent.parse_mode is None and sent.text == "[Echo] *bold* <tag>"
            assert fake.calls.count("sendMessage") == 3
    run(scenario())


def test_a_failing_api_is_retried_without_leaking_the_token(home, caplog):
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with bridge(home) as (fake, running, _):
            fake.fail("getUpdates", "500", "drop")
            fake.send(OWNER, "still there?")
            await until(lambda: texts(fake, OWNER), 30)
            assert running.status["errors"] >= 1
            assert TOKEN not in running.status["last_error"]
    run(scenario())
    assert TOKEN not in caplog.text


def test_an_unexpected_error_in_a_fetch_is_retried_not_the_end_of_the_bridge(home, caplog):
    """Only a BridgeError was retried: any other error a fetch raised (a defect, or a
    library's error the platform did not wrap, such as Matrix's TypeError on an odd
    event) ended the bridge's task, silently, until the kernel stopped.  Now it is
    reported by its type and place (its text may quote what was received) and the
    bridge goes on."""
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with bridge(home) as (fake, running, _):
            platform, raised = running.platform, []
            fetch = platform.fetch

            async def failing_once():
                if not raised:
                    raised.append(1)
                    raise ValueError("it quoted secret received words")
                return await fetch()
            platform.fetch = failing_once
            await until(lambda: raised, 10)
            fake.send(OWNER, "still there?")
            await until(lambda: texts(fake, OWNER), 30)
            assert texts(fake, OWNER) == ["[Echo] still there?"]
            assert running.status["errors"] == 1 and running.status["state"] == "running"
            assert running.status["last_error"].startswith(
                "unexpected ValueError at test_telegram.py:")
    run(scenario())
    assert "unexpected ValueError at test_telegram.py:" in caplog.text
    assert "secret received words" not in caplog.text


def test_an_update_the_platform_cannot_read_is_skipped_and_the_next_answered(home, caplog):
    """A defect reading one update failed the whole fetch, and the retry fetched the
    same batch again: every message after it waited for ever.  Now that update is
    left out (logged by its id and the error's type) and the batch goes on."""
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with bridge(home) as (fake, running, _):
            await odd_item_skipped(running, lambda text: fake.send(OWNER, text),
                                   lambda: texts(fake, OWNER))
    run(scenario())
    assert "telegram: skipped an incoming item it could not read (update " in caplog.text
    assert "quoted the odd one" not in caplog.text


@pytest.mark.parametrize("odd", [{"date": "soon"}, {"chat": 5}, {"from": [OWNER]},
                                 {"entities": "bold"}], ids=repr)
def test_an_update_python_telegram_bot_cannot_parse_is_skipped_not_the_whole_batch(
        home, caplog, odd):
    """Polling took its batch through `Bot.get_updates`, which parses every update at
    once: one it could not parse failed them all on every poll, so the bridge never
    answered again, and python-telegram-bot logged the batch, text included."""
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with bridge(home) as (fake, running, _):
            update = fake.message_update(OWNER, "private words of the odd one")
            update["message"].update(odd)
            fake.updates.append(update)
            fake.send(OWNER, "after it")
            await until(lambda: texts(fake, OWNER), 30)
            assert texts(fake, OWNER) == ["[Echo] after it"]
            assert running.status["errors"] == 0
            return update["update_id"]
    skipped = run(scenario())
    assert f"telegram: skipped an incoming item it could not read (update {skipped}" \
        in caplog.text
    assert "private words" not in caplog.text


def test_media_edits_and_captions(home):
    async def scenario():
        async with bridge(home) as (fake, _, kernel):
            fake.send(OWNER, None, photo=[{"file_id": "p", "file_unique_id": "u",
                                           "width": 1, "height": 1}])
            await until(lambda: texts(fake, OWNER))
            assert "text only" in texts(fake, OWNER)[0]
            fake.send(OWNER, None, caption="look at this", photo=[
                {"file_id": "p", "file_unique_id": "u", "width": 1, "height": 1}])
            fake.send(OWNER, "changed my mind", edited=True)
            await until(lambda: len(texts(fake, OWNER)) == 2)
            await asyncio.sleep(0.3)
            assert texts(fake, OWNER)[1] == "[Echo] look at this"
            assert len(texts(fake, OWNER)) == 2
    run(scenario())


def test_flood_control_answers_the_excess_once(home):
    async def scenario():
        async with bridge(home, messages_per_minute=3) as (fake, running, _):
            for i in range(6):
                fake.send(OWNER, f"message {i}")
            await until(lambda: len(texts(fake, OWNER)) == 4, 30)
            await asyncio.sleep(0.3)
            said = texts(fake, OWNER)
            assert len(said) == 4 and sum("faster than 3" in t for t in said) == 1
    run(scenario())


SHELL = '(:type :REQUEST :target :shell :cmd ("echo" "approved-run"))'
AFTER = '(:type :RESPONSE :text "after the command")'   # the model's answer after the step
STEP = "⚙ step 1: shell echo approved-run → "


def archived(home: Path) -> str:
    """The owner's chat as archived: the turn with its step and the step's result."""
    path = home / "memory" / "telegram" / f"{OWNER}.org"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def buttons(sent) -> list[str]:
    markup = json.loads(sent.reply_markup) if isinstance(sent.reply_markup, str) \
        else sent.reply_markup
    return [button["callback_data"] for row in markup["inline_keyboard"] for button in row]


async def approval_scenario(home, tmp_path, clicks):
    owners = {f"telegram:{OWNER}": "developer"}
    async with bridge(home, script(tmp_path, SHELL, AFTER), owners=owners) as (fake, _, _):
        fake.send(OWNER, "run it")
        await until(lambda: any(s.reply_markup for s in fake.sent))
        asked = next(s for s in fake.sent if s.reply_markup)
        assert "echo approved-run" in asked.text and "Approve" in str(asked.reply_markup)
        approve, deny = buttons(asked)
        for user, which in clicks:
            fake.click(user, asked, approve if which == "approve" else deny)
            await until(lambda: len(fake.answers) >= 1)
        await until(lambda: asked.edits, 20)
        await until(lambda: "after the command" in texts(fake, OWNER))
        return fake, asked


def test_an_approval_approved_by_the_owner_runs(home, tmp_path):
    async def scenario():
        fake, asked = await approval_scenario(home, tmp_path, [(OWNER, "approve")])
        assert fake.answers[0][1] == "Approved."
        assert "approved" in asked.edits[0]
        assert STEP + "done" in texts(fake, OWNER)
    run(scenario())
    assert "Shell: echo approved-run (exit 0)" in archived(home)   # it ran; the model read it


def test_a_click_by_someone_else_is_refused_then_the_owner_denies(home, tmp_path):
    async def scenario():
        fake, asked = await approval_scenario(home, tmp_path,
                                              [(FRIEND, "approve"), (OWNER, "deny")])
        assert "Only the person" in fake.answers[0][1]
        assert fake.answers[1][1] == "Denied."
        assert STEP + "not approved" in texts(fake, OWNER)
    run(scenario())
    assert "denied by the owner" in archived(home) and "(exit 0)" not in archived(home)


def test_a_guest_cannot_approve_their_own_command(home, tmp_path):
    """A guest's command needs an owner's yes, which a guest's turn cannot ask for:
    no approval is offered, nothing runs, and the model is told so."""
    async def scenario():
        async with bridge(home, script(tmp_path, SHELL, AFTER)) as (fake, _, _):
            fake.send(OWNER, "run it")
            await until(lambda: "after the command" in texts(fake, OWNER))
            assert not any(s.reply_markup for s in fake.sent)
            assert STEP + "denied" in texts(fake, OWNER)
    run(scenario())
    assert "cannot ask the owner" in archived(home) and "(exit 0)" not in archived(home)


def test_an_unanswered_approval_expires(home, tmp_path):
    async def scenario():
        owners = {f"telegram:{OWNER}": "developer"}
        async with bridge(home, script(tmp_path, SHELL), owners=owners,
                          approval_timeout=0.3) as (fake, _, _):
            fake.send(OWNER, "run it")
            await until(lambda: any(s.edits for s in fake.sent))
            asked = next(s for s in fake.sent if s.reply_markup)
            assert "timed-out" in asked.edits[0]
            fake.click(OWNER, asked, buttons(asked)[0])
            await until(lambda: fake.answers)
            assert "no longer open" in fake.answers[0][1]
    run(scenario())


def test_a_leftover_webhook_is_reported_and_removed(home, caplog):
    async def scenario():
        fake = FakeBotApi(TOKEN)
        fake.webhook_url = "https://example.invalid/hook"
        url = await fake.start()
        settings = TelegramSettings(enabled=True, base_url=url, poll_timeout=1)
        platform = TelegramPlatform(settings, TOKEN)
        try:
            assert await platform.start() == BOT_NAME
            assert fake.webhook_url == "" and "deleteWebhook" in fake.calls
        finally:
            await platform.stop()
            await fake.stop()
    run(scenario())
    assert "webhook is set" in caplog.text


@pytest.mark.parametrize("text,command", [("/start", "/help"), (f"/history@{BOT_NAME} 2",
                                                                 "/history 2")])
def test_platform_command_conventions(home, text, command):
    async def scenario():
        async with bridge(home) as (fake, running, _):
            assert running._command_text(text) == command
            fake.send(OWNER, text)
            await until(lambda: texts(fake, OWNER))
            assert not texts(fake, OWNER)[0].startswith("[Echo]")
    run(scenario())


def test_a_channel_without_archive_keeps_nothing_on_disk(home):
    async def scenario():
        async with bridge(home, archive=False) as (fake, running, kernel):
            fake.send(OWNER, "remember nothing of this")
            fake.send(OWNER, "/help")
            await until(lambda: len(texts(fake, OWNER)) >= 3)
            assert "not archived" in texts(fake, OWNER)[-1]
            assert kernel.archive.threads() == []
            assert kernel.archive.search("remember") == []
            history = await kernel.run_command(Thread("telegram", str(OWNER)), "/history")
            assert "remember nothing of this" in history
    run(scenario())


def test_doctor_checks_an_enabled_bridge(home):
    import os
    import subprocess
    import sys
    import threading

    from conftest import cli_env

    loop = asyncio.new_event_loop()
    fake = FakeBotApi(TOKEN)
    url = loop.run_until_complete(fake.start())
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()
    try:
        (home / "config.toml").write_text(
            f'[bridges.telegram]\nenabled = true\nbase_url = "{url}"\n'
            'token_env = "TEST_TELEGRAM_TOKEN"\nallow = [7]\n')
        command = [sys.executable, "-m", "opencortex", "doctor"]
        done = subprocess.run(command, env=cli_env(home, TEST_TELEGRAM_TOKEN=TOKEN),
                              capture_output=True, text=True, timeout=120)
        assert f"ok  bridge: telegram: connected as {BOT_NAME}" in done.stdout
        env = {k: v for k, v in cli_env(home).items() if k != "TEST_TELEGRAM_TOKEN"}
        missing = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert "NO  bridge: telegram: $TEST_TELEGRAM_TOKEN is not set" in missing.stdout
        assert TOKEN not in done.stdout + done.stderr + missing.stdout + missing.stderr
        assert os.environ.get("TEST_TELEGRAM_TOKEN") is None
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        server.join(10)


def test_an_approval_answered_by_a_text_reply(home, tmp_path):
    async def scenario():
        owners = {f"telegram:{OWNER}": "developer"}
        async with bridge(home, script(tmp_path, SHELL, AFTER), owners=owners) as (fake, _, _):
            fake.send(OWNER, "run it")
            await until(lambda: any(s.reply_markup for s in fake.sent))
            asked = next(s for s in fake.sent if s.reply_markup)
            fake.send(OWNER, "Approve")
            await until(lambda: asked.edits, 20)
            assert "approved" in asked.edits[0]
            await until(lambda: "after the command" in texts(fake, OWNER))
            assert "Approved." in texts(fake, OWNER) and STEP + "done" in texts(fake, OWNER)
    run(scenario())
    assert "Shell: echo approved-run (exit 0)" in archived(home)


def test_after_a_crash_a_pending_message_already_archived_gets_its_reply_not_a_new_turn(
        home, monkeypatch):
    """A reply is said only once its turn is durable: a crash between the write and the
    saying left it archived and unsaid, and the redelivered message was skipped.  Each
    reply is sent under its archived id (a platform with idempotent sends, Matrix, then
    sends a reply said again only once; the Bot API cannot)."""
    from opencortex.bridges.inbound import Inbound
    from opencortex.bridges.inbox import Inbox
    from opencortex.memory import Archive, NewMessage
    thread = Thread("telegram", str(OWNER))
    keys = []
    send = TelegramPlatform.send

    async def keyed_send(self, chat_id, html, plain, key=None, reply_to=None):
        keys.append(key)
        await send(self, chat_id, html, plain, key, reply_to)
    monkeypatch.setattr(TelegramPlatform, "send", keyed_send)
    with Archive(home / "memory") as archive:       # the turn ended, then the kernel died
        said = archive.append([NewMessage(role="user", text="answered", thread=thread,
                                          extra={"PLATFORM_ID": "55"}),
                               NewMessage(role="assistant", text="[Echo] answered", thread=thread)])
    inbox = Inbox(home / "bridges" / "telegram.inbox.jsonl")
    inbox.add([Inbound(position=9, chat_id=str(OWNER), sender_id=str(OWNER), message_id="55",
                       text="answered"),
               Inbound(position=10, chat_id=str(OWNER), sender_id=str(OWNER), message_id="56",
                       text="not yet")])
    inbox.close()

    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            await until(lambda: len(texts(fake, OWNER)) == 2)
            await until(lambda: not running.inbox.pending())
            await asyncio.sleep(0.3)
            assert texts(fake, OWNER) == ["[Echo] answered", "[Echo] not yet"]
            replies = [r for r in kernel.archive.read_thread(thread) if r.role == "assistant"]
            assert keys == [f"{said[1].id}/0", f"{replies[-1].id}/0"]
    run(scenario())
    assert archived(home).count("answered") == 2        # no second turn was archived


def test_strangers_refusals_never_delay_the_owners_reply_and_leave_nothing_pending(home):
    """300 strangers write first: their refusals are best effort, after the owner's reply
    (through the shared pacer, first come first served, it waited 300/25 = 12 s)."""
    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            for n in range(300):
                fake.send(100_000 + n, f"stranger text {n}")
            fake.send(OWNER, "hello")
            started = asyncio.get_running_loop().time()
            await until(lambda: texts(fake, OWNER), 20)
            assert asyncio.get_running_loop().time() - started < 2.0
            await until(lambda: not running.inbox.pending(), 10)
            assert running.gate.counts["stranger"] == 300
            refused = [s for s in fake.sent if s.chat_id != str(OWNER)]
            assert 1 <= len(refused) <= service.REFUSAL_BACKLOG
            assert all(s.text == "Sorry, this is a private assistant." for s in refused)
            await asyncio.sleep(0.2)   # the inbox's queued writes
            assert "stranger text" not in running.inbox.path.read_text()   # never on disk
    run(scenario())


def test_a_refusal_waiting_for_its_chats_slot_holds_up_no_other_chats(home):
    """One message a second in a chat: the second refusal owed to one stranger waits that
    long, and the refusal owed to another stranger behind it goes first."""
    async def scenario():
        async with bridge(home, refusal_interval=0) as (fake, running, _):
            fake.send(STRANGER, "one")
            fake.send(STRANGER, "two")
            fake.send(STRANGER + 1, "hello")
            await until(lambda: len(fake.sent) == 3, 10)
            assert [s.chat_id for s in fake.sent] == [str(STRANGER), str(STRANGER + 1),
                                                      str(STRANGER)]
    run(scenario())


def test_update_ids_that_restart_below_the_done_window_are_answered(home, monkeypatch, caplog):
    """After a week without updates Telegram picks the next update id at random, and a home
    may move to another bot: ids under what the inbox handled start a new sequence."""
    from opencortex.bridges import inbox as inbox_module
    monkeypatch.setattr(inbox_module, "DONE_WINDOW", 40)
    monkeypatch.setattr(inbox_module, "RESTART_GAP", 10, raising=False)

    async def first():
        async with bridge(home, strangers="silence") as (fake, running, kernel):
            for n in range(60):
                fake.send(100_000 + n, "x")
            fake.send(OWNER, "before")
            await until(lambda: texts(fake, OWNER))

    async def second(start: int):
        async with bridge(home, strangers="silence") as (fake, running, kernel):
            fake.next_update = start
            for n in range(3):
                fake.send(OWNER, f"after {start} {n}")
                await until(lambda: len(texts(fake, OWNER)) == n + 1, 10)
            await until(lambda: fake.confirmed >= start + 2, 10)
            assert fake.updates == [] or fake.updates[0]["update_id"] > start + 2
    run(first())        # ids 1..61: done window 22..61, floor 21
    run(second(5))      # under the floor
    run(first())
    run(second(30))     # inside the done window, far under the highest (61)
    assert "after" not in caplog.text
    assert "a new sequence of update ids" in caplog.text


def test_a_reply_the_bot_api_refuses_stays_archived_with_a_mark_it_was_not_delivered(home):
    thread = Thread("telegram", str(OWNER))

    def marks(kernel):
        return [r for r in kernel.archive.read_thread(thread)
                if r.extra.get("CONTROL") == "delivery"]

    async def scenario():
        async with bridge(home) as (fake, _, kernel):
            fake.fail("sendMessage", "500", "500", "500")
            fake.send(OWNER, "are you there")
            await until(lambda: marks(kernel), 30)
            records = kernel.archive.read_thread(thread)
            reply, mark = records[-2:]
            assert reply.role == "assistant" and reply.text == "[Echo] are you there"
            assert mark.extra["TARGET"] == reply.id and mark.extra["DELIVERY"] == "failed"
            assert texts(fake, OWNER) == []
            history = await kernel.run_command(thread, "/history")
            assert "[not delivered: the person never saw this] [Echo] are you there" in history
    run(scenario())


def test_a_message_that_waited_while_the_kernel_was_down_is_dated_when_it_was_sent(
        home, tmp_path):
    """A message Telegram kept for an hour (the kernel was down) is archived with
    Telegram's date, not the time the bridge got it: recall shows the day it was
    said, and a later `memory import` of the chat's export recognises it (before, a
    message taken more than a minute late was imported a second time).  A date
    after the bridge got it is not believed."""
    from opencortex.memory.importer import import_file
    sent = int(time.time()) - 3600

    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            fake.send(OWNER, "the boiler man comes on friday", date=sent)
            fake.send(OWNER, "from the future", date=int(time.time()) + 86400)
            await until(lambda: len(texts(fake, OWNER)) == 2)
            thread = Thread("telegram", str(OWNER))
            said = {r.text: r.timestamp for r in kernel.archive.read_thread(thread)
                    if r.role == "user"}
            assert said["the boiler man comes on friday"] == sent
            assert time.time() - 60 < said["from the future"] <= time.time()
            export = tmp_path / "result.json"
            export.write_text(json.dumps({"name": "user7", "type": "personal_chat",
                                          "id": OWNER, "messages": [
                {"id": 1, "type": "message", "date": "2026-11-28T10:00:00",
                 "date_unixtime": str(sent), "from": "user7", "from_id": f"user{OWNER}",
                 "text": "the boiler man comes on friday", "text_entities": []}]}))
            report = await asyncio.to_thread(import_file, kernel.archive, export)
            assert (report.added, report.duplicates) == (0, 1)
    run(scenario())


def test_a_long_reply_sent_in_pieces_is_not_imported_again(home, tmp_path):
    """A reply too long for one Telegram message goes out in pieces, each a message of
    the chat's export; `memory import` of that export recognises every piece as the
    one archived reply (before, each piece was imported as a message of its own)."""
    import html
    import re
    from opencortex.memory.importer import import_file
    long = "\n\n".join(f"Paragraph {i}, *in bold*. " + "word " * 150 for i in range(12))
    reply = f'(:type :REQUEST :target :telegram :chat-id "{OWNER}" :text "{long}")'
    sent = int(time.time())

    async def scenario():
        async with bridge(home, script(tmp_path, reply)) as (fake, _, kernel):
            fake.send(OWNER, "tell me a lot", date=sent)
            await until(lambda: sum(len(t) for t in texts(fake, OWNER)) >= len(long) - 50)
            pieces = [s for s in fake.sent if s.chat_id == str(OWNER)]
            assert len(pieces) >= 3
            exported = [{"id": 1, "type": "message", "date": "2026-11-28T10:00:00",
                         "date_unixtime": str(sent), "from": "user7",
                         "from_id": f"user{OWNER}", "text": "tell me a lot",
                         "text_entities": []}]
            exported += [{"id": number, "type": "message", "date": "2026-11-28T10:00:00",
                          "date_unixtime": str(piece.date), "from": "Cortex",
                          "from_id": "user4242",      # what a person reads of each piece
                          "text": html.unescape(re.sub(r"<[^>]+>", "", piece.text)),
                          "text_entities": []} for number, piece in enumerate(pieces, 2)]
            export = tmp_path / "result.json"
            export.write_text(json.dumps({"name": "user7", "type": "personal_chat",
                                          "id": OWNER, "messages": exported}))
            before = kernel.archive.read_thread(Thread("telegram", str(OWNER)))
            report = await asyncio.to_thread(import_file, kernel.archive, export)
            assert (report.added, report.duplicates) == (0, 1 + len(pieces))
            assert kernel.archive.read_thread(Thread("telegram", str(OWNER))) == before
    run(scenario())
