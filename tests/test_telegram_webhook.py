"""Telegram in webhook mode: the real python-telegram-bot, a loopback fake Bot API, and
updates POSTed to the receiver as Telegram POSTs them."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from pydantic import ValidationError

from opencortex.bridges.contract import BridgeError
from opencortex.bridges.inbox import Inbox
from opencortex.bridges.service import Bridge
from opencortex.bridges.settings import BridgesSettings, TelegramSettings
from opencortex.bridges.telegram import UPDATES, TelegramPlatform
from opencortex.bridges.telegram_webhook import SECRET_HEADER, WebhookReceiver
from opencortex.config import load_config
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

from telegram_fake import FakeBotApi
from test_telegram import OWNER, TOKEN, run, texts, until

SECRET = "s3cret_Token-for-the-webhook"
SECRET_ENV = "TEST_TELEGRAM_WEBHOOK_SECRET"
HOOK = "https://bot.example.org/telegram/hook"
PATH = "/telegram/hook"


class RecordingInbox(Inbox):
    """An inbox that notes, for each update it keeps, the webhook answers already received."""

    def __init__(self, path: Path, answered: list[tuple[int, int]]):
        super().__init__(path)
        self.answered = answered
        self.kept: list[tuple[int, list[tuple[int, int]]]] = []

    async def keep(self, messages):
        fresh = await super().keep(messages)
        self.kept += [(m.position, list(self.answered)) for m in messages]
        return fresh


async def post(port: int, body, *, secret: str | None = SECRET, path: str = PATH,
               content_type: str = "application/json", method: str = "POST",
               answered: list | None = None) -> int:
    """POST BODY (an update, or bytes) to the receiver as Telegram does; the status."""
    headers = {"Content-Type": content_type}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"http://127.0.0.1:{port}{path}", data=data,
                                   headers=headers) as response:
            await response.read()
    if answered is not None and isinstance(body, dict):
        answered.append((body["update_id"], response.status))
    return response.status


def webhook_settings(url: str, **settings) -> TelegramSettings:
    options = {"allow": [str(OWNER)], "poll_timeout": 1, "webhook_url": HOOK,
               "webhook_port": 0, "webhook_secret_env": SECRET_ENV, **settings}
    return TelegramSettings(enabled=True, base_url=url, **options)


@asynccontextmanager
async def webhook_bridge(home: Path, gate: asyncio.Event | None = None):
    """The kernel (echo backend) with a webhook-mode Telegram bridge; yields the fake, the
    bridge, its recording inbox, the receiver's port and the list of webhook answers.
    With GATE, the bridge fetches nothing before GATE is set."""
    fake = FakeBotApi(TOKEN)
    settings = webhook_settings(await fake.start())
    config = load_config(home).model_copy(
        update={"bridges": BridgesSettings(telegram=settings)})
    kernel = build_kernel(config, backend=EchoBackend())
    answered: list[tuple[int, int]] = []
    inbox = RecordingInbox(home / "bridges" / "telegram.inbox.jsonl", answered)
    platform = TelegramPlatform(settings, TOKEN)
    if gate is not None:
        fetch = platform.fetch

        async def gated():
            await gate.wait()
            return await fetch()
        platform.fetch = gated
    running = Bridge(platform, settings, kernel, inbox, 30.0)
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    try:
        await until(lambda: running.bot_name)
        yield fake, running, inbox, running.platform.receiver.port, answered
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await kernel.aclose()
        await fake.stop()


def test_webhook_mode_sets_the_webhook_and_answers_after_the_inbox_kept_it(
        home, monkeypatch, caplog):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    caplog.set_level(logging.DEBUG)

    async def scenario():
        gate = asyncio.Event()
        async with webhook_bridge(home, gate) as (fake, running, inbox, port, answered):
            assert (fake.webhook_url, fake.webhook_secret) == (HOOK, SECRET)
            assert fake.webhook_allowed == UPDATES and fake.webhook_max_connections == 1
            update = fake.message_update(OWNER, "hello over the hook")
            posting = asyncio.create_task(post(port, update, answered=answered))
            await until(lambda: running.platform.receiver.pending == 1)
            assert await post(port, update, secret="wrong") == 403   # a full round trip
            assert not posting.done() and inbox.kept == []   # not kept: not answered
            gate.set()
            assert await posting == 200
            assert inbox.kept == [(update["update_id"], [])]   # kept before it was answered
            await until(lambda: texts(fake, OWNER))
            assert texts(fake, OWNER) == ["[Echo] hello over the hook"]
            unreadable = {"update_id": update["update_id"] + 1, "message": "not an object"}
            assert await post(port, unreadable) == 200        # skipped, not redelivered
            assert len(inbox.kept) == 1
        assert "getUpdates" not in fake.calls and "deleteWebhook" not in fake.calls
        assert fake.webhook_url == HOOK                       # stop leaves it set
    run(scenario())
    assert "skipped an incoming item it could not read (update " in caplog.text
    for secret in (TOKEN, SECRET, "hello over the hook"):
        assert secret not in caplog.text


def test_a_request_without_the_right_secret_is_refused_and_goes_nowhere(
        home, monkeypatch, caplog):
    monkeypatch.setenv(SECRET_ENV, SECRET)

    async def scenario():
        async with webhook_bridge(home) as (fake, running, inbox, port, _):
            forged = fake.message_update(OWNER, "forged words")
            assert await post(port, forged, secret="wrong") == 403
            assert await post(port, forged, secret=None) == 403
            assert await post(port, forged, secret=SECRET[:-1]) == 403
            real = fake.message_update(OWNER, "real words")
            assert await post(port, real) == 200
            await until(lambda: texts(fake, OWNER))
            assert [position for position, _ in inbox.kept] == [real["update_id"]]
            assert texts(fake, OWNER) == ["[Echo] real words"]
            assert running.gate.counts.get("stranger", 0) == 0
    run(scenario())
    assert caplog.text.count("without the right secret token") == 1
    assert "forged" not in caplog.text and SECRET not in caplog.text


def test_a_redelivered_update_is_answered_once(home, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)

    async def scenario():
        async with webhook_bridge(home) as (fake, _, inbox, port, _):
            first = fake.message_update(OWNER, "first")
            assert await post(port, first) == 200
            await until(lambda: texts(fake, OWNER))
            assert await post(port, first) == 200          # Telegram sends it again
            assert await post(port, fake.message_update(OWNER, "second")) == 200
            await until(lambda: len(texts(fake, OWNER)) >= 2)
            assert texts(fake, OWNER) == ["[Echo] first", "[Echo] second"]
            assert [position for position, _ in inbox.kept].count(first["update_id"]) == 2
    run(scenario())


def test_a_missing_or_malformed_secret_refuses_to_start(home, monkeypatch):
    async def scenario():
        fake = FakeBotApi(TOKEN)
        settings = webhook_settings(await fake.start())
        try:
            for value, says in ((None, "is not set"), ("", "is not set"),
                                ("has spaces!", "A-Z a-z 0-9 _ -"), ("x" * 257, "1-256")):
                if value is None:
                    monkeypatch.delenv(SECRET_ENV, raising=False)
                else:
                    monkeypatch.setenv(SECRET_ENV, value)
                platform = TelegramPlatform(settings, TOKEN)
                with pytest.raises(BridgeError) as refused:
                    await platform.start()
                await platform.stop()
                assert refused.value.fatal and f"${SECRET_ENV}" in str(refused.value)
                assert says in str(refused.value)
                assert platform.receiver is None
                assert not value or value not in str(refused.value)
            assert fake.calls == []                          # not even getMe
        finally:
            await fake.stop()
    run(scenario())


def test_switching_back_to_polling_deletes_the_webhook(home, monkeypatch, caplog):
    monkeypatch.setenv(SECRET_ENV, SECRET)

    async def scenario():
        fake = FakeBotApi(TOKEN)
        url = await fake.start()
        try:
            hooked = TelegramPlatform(webhook_settings(url), TOKEN)
            await hooked.start()
            await hooked.stop()
            assert fake.webhook_url == HOOK
            fake.send(OWNER, "sent while the webhook was set")
            polling = TelegramPlatform(webhook_settings(url, webhook_url=""), TOKEN)
            try:
                await polling.start()
                assert fake.webhook_url == "" and "deleteWebhook" in fake.calls
                items = await polling.fetch()
                assert [item.text for item in items] == ["sent while the webhook was set"]
            finally:
                await polling.stop()
        finally:
            await fake.stop()
    run(scenario())
    assert "webhook is set" in caplog.text


def test_the_receiver_answers_only_when_kept_and_bounds_what_it_holds():
    async def scenario():
        receiver = WebhookReceiver("127.0.0.1", 0, PATH, SECRET, lambda u: u["update_id"],
                                   max_body=1024, max_pending=1, ack_timeout=0.5)
        await receiver.start()
        port = receiver.port
        try:
            assert await post(port, {"update_id": 1}, method="GET") == 405
            assert await post(port, {"update_id": 1}, path="/elsewhere") == 404
            assert await post(port, {"update_id": 1}, content_type="text/plain") == 415
            assert await post(port, b'{"update_id": 1, "x": "' + b"a" * 2048 + b'"}') == 413
            assert await post(port, b"{not json") == 400
            assert await post(port, b"[" * 1000) == 400    # too deep for json: not a 500
            assert await post(port, {"no_update_id": 1}) == 400

            waiting = asyncio.create_task(post(port, {"update_id": 1}))
            assert await receiver.take(30) == [1]
            assert await post(port, {"update_id": 1}, secret="wrong") == 403
            assert not waiting.done()                  # not kept yet: no answer
            receiver.confirm()
            assert await waiting == 200

            unconfirmed = asyncio.create_task(post(port, {"update_id": 2}))
            assert await receiver.take(30) == [2]
            assert await receiver.take(0) == []        # taken again without a confirm
            assert await unconfirmed == 500            # so Telegram redelivers

            held = asyncio.create_task(post(port, {"update_id": 3}))
            await until(lambda: receiver.pending == 1)
            assert await post(port, {"update_id": 4}) == 503   # the queue is full
            assert await held == 500                   # nobody took it within ack_timeout
            assert receiver.pending == 0

            closing = asyncio.create_task(post(port, {"update_id": 5}))
            await until(lambda: receiver.pending == 1)
        finally:
            await receiver.stop()
        assert await closing == 503
    run(scenario())


def test_webhook_settings_are_checked():
    with pytest.raises(ValidationError, match="https"):
        TelegramSettings(webhook_url="http://bot.example.org/hook")
    with pytest.raises(ValidationError, match="must start with /"):
        TelegramSettings(webhook_url=HOOK, webhook_path="hook")
    assert TelegramSettings(webhook_url=HOOK, webhook_path="/in").webhook_path == "/in"


def test_update_ids_that_start_again_lower_are_answered_over_the_webhook(home, monkeypatch):
    """The same inbox serves the webhook: ids under what it handled start a new sequence."""
    from opencortex.bridges import inbox as inbox_module
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setattr(inbox_module, "DONE_WINDOW", 4)
    monkeypatch.setattr(inbox_module, "RESTART_GAP", 2, raising=False)

    async def scenario():
        async with webhook_bridge(home) as (fake, running, inbox, port, _):
            fake.next_update = 100
            for n in range(10):
                assert await post(port, fake.message_update(900 + n, "x")) == 200
            assert await post(port, fake.message_update(OWNER, "before")) == 200
            await until(lambda: texts(fake, OWNER))
            await until(lambda: not inbox.pending())
            fake.next_update = 5                          # under the floor (106)
            assert await post(port, fake.message_update(OWNER, "after")) == 200
            await until(lambda: len(texts(fake, OWNER)) == 2, 10)
            assert texts(fake, OWNER) == ["[Echo] before", "[Echo] after"]
    run(scenario())
