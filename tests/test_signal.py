"""The Signal bridge: the real platform module against a loopback fake of signal-cli's daemon."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from opencortex.bridges.inbox import Inbox
from opencortex.bridges.service import Bridge
from opencortex.bridges import service
from opencortex.bridges.settings import SignalSettings
from opencortex.bridges.signal import SignalPlatform
from opencortex.config import load_config
from opencortex.events import Thread
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

from bridge_helpers import odd_item_skipped, archived_step, run, running_bridge, script, until
from signal_fake import (FRIEND, GROUP, OTHER_GROUP, OWNER, STRANGER, FakeSignalCli, Person,
                         rate_limited)

SHELL = '(:type :REQUEST :target :shell :cmd ("echo" "approved-run"))'
AFTER = '(:type :RESPONSE :text "after the command")'   # the model's answer after the step
STEP = "⚙ step 1: shell echo approved-run → "


@asynccontextmanager
async def bridge(home: Path, backend=None, owners=None, **settings):
    fake = FakeSignalCli()
    address = await fake.start()
    options = {"allow": [OWNER.uuid, FRIEND.number], "poll_timeout": 1.0, **settings}
    signal = SignalSettings(enabled=True, address=address, **options)
    try:
        async with running_bridge(home, SignalPlatform(signal), signal, backend=backend,
                                  owners=owners) as (running, kernel):
            yield fake, running, kernel
    finally:
        await fake.stop()


def texts(fake, chat) -> list[str]:
    return [s.text for s in fake.sent if s.chat_id == chat]


# -- who is answered --------------------------------------------------------------

def test_owner_by_uuid_is_answered_with_styles_and_a_stranger_is_refused_once(home, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(service, "TYPING_AFTER", 0.0)   # echo answers before it otherwise

    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            fake.message(STRANGER, "secret stranger words")
            fake.message(STRANGER, "more stranger words")
            fake.message(OWNER, "hello *there*")
            await until(lambda: texts(fake, OWNER.uuid))
            await asyncio.sleep(0.3)
            reply = next(s for s in fake.sent if s.chat_id == OWNER.uuid)
            assert (reply.text, reply.styles) == ("[Echo] hello there", ["13:5:BOLD"])
            assert reply.quote is None                    # a direct answer quotes nothing
            assert texts(fake, STRANGER.uuid) == ["Sorry, this is a private assistant."]
            assert (OWNER.uuid, False) in fake.typing
            assert running.gate.counts["stranger"] == 2
            assert {str(t) for t in kernel.archive.threads()} == {f"signal:{OWNER.uuid}"}
            sends = [r["params"] for r in fake.requests if r["method"] == "send"]
            assert all(p["recipient"] in ([OWNER.uuid], [STRANGER.uuid]) for p in sends)
            assert fake.calls.count("subscribeReceive") == 1
    run(scenario())
    assert "stranger words" not in caplog.text and "hello" not in caplog.text


def test_a_notification_the_platform_cannot_read_is_skipped_and_the_rest_answered(
        home, caplog):
    """A defect reading one notification failed the whole fetch; signal-cli does not
    send a notification twice, so its batch was lost.  Now only that one is left out."""
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with bridge(home) as (fake, running, _):
            await odd_item_skipped(running, lambda text: fake.message(OWNER, text),
                                   lambda: texts(fake, OWNER.uuid))
    run(scenario())
    assert "signal: skipped an incoming item it could not read (notification " in caplog.text
    assert "quoted the odd one" not in caplog.text


def test_an_allowed_number_is_answered_under_its_uuid(home):
    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            fake.message(FRIEND, "hi from my number")
            await until(lambda: texts(fake, FRIEND.uuid))
            assert texts(fake, FRIEND.uuid) == ["[Echo] hi from my number"]
            assert not texts(fake, FRIEND.number)
            assert {str(t) for t in kernel.archive.threads()} == {f"signal:{FRIEND.uuid}"}
            # the gate knows the UUID now; the configuration stays as written
            assert running.gate.is_allowed(FRIEND.uuid)
            assert running.settings.allow == [OWNER.uuid, FRIEND.number]
            hidden = Person(FRIEND.uuid, None, FRIEND.name)   # the number hidden since
            fake.message(hidden, "my number is private now")
            await until(lambda: len(texts(fake, FRIEND.uuid)) == 2)
            assert texts(fake, FRIEND.uuid)[-1] == "[Echo] my number is private now"
    run(scenario())


def test_a_message_kept_while_the_daemon_was_away_is_dated_when_it_was_sent(home):
    """The person's client stamps a message; the kernel dates it so unless the stamp is
    after it came or beyond `events.MAX_QUEUED` (anyone's client may say anything)."""
    now = int(time.time() * 1000)

    async def scenario():
        async with bridge(home) as (fake, running, kernel):
            fake.message(OWNER, "sent in the tunnel", sent=now - 7_200_000)
            fake.message(OWNER, "stamped 1970", sent=5)
            await until(lambda: len(texts(fake, OWNER.uuid)) == 2)
            said = {r.text: r.timestamp for r in
                    kernel.archive.read_thread(Thread("signal", OWNER.uuid)) if r.role == "user"}
            assert said["sent in the tunnel"] == (now - 7_200_000) / 1000
            assert said["stamped 1970"] >= now / 1000 - 1
    run(scenario())


def test_groups_answer_only_allowed_groups_when_addressed(home):
    async def scenario():
        async with bridge(home, groups=[GROUP]) as (fake, running, kernel):
            fake.message(OWNER, "no mention", group=GROUP)
            asked = fake.message(OWNER, "hi bot", group=GROUP, mention_bot=True)
            await until(lambda: texts(fake, GROUP))
            assert fake.sent[-1].quote == (OWNER.uuid, asked)    # an answer quotes, in a group
            fake.message(OWNER, "about that", group=GROUP, quote=fake.sent[-1])
            fake.message(STRANGER, "hi bot", group=GROUP, mention_bot=True)
            fake.message(OWNER, "hi bot", group=OTHER_GROUP, mention_bot=True)
            await until(lambda: len(texts(fake, GROUP)) == 2)
            await asyncio.sleep(0.3)
            assert texts(fake, GROUP) == ["[Echo] hi bot", "[Echo] about that"]
            assert not texts(fake, OTHER_GROUP) and not texts(fake, STRANGER.uuid)
            assert all(s.is_group for s in fake.sent)
            counts = running.gate.counts
            assert (counts["group-not-addressed"], counts["group-stranger"],
                    counts["group-not-allowed"]) == (1, 1, 1)
            assert {str(t) for t in kernel.archive.threads()} == {f"signal:{GROUP}"}
    run(scenario())


# -- messages that are not plain text ---------------------------------------------

def test_attachments_get_text_only_captions_are_read_edits_and_deletions_ignored(home):
    photo = {"contentType": "image/jpeg", "filename": None, "id": "a1", "size": 1024,
             "width": 10, "height": 10, "caption": None, "uploadTimestamp": 1}

    async def scenario():
        async with bridge(home) as (fake, _, _):
            first = fake.message(OWNER, None, attachments=[photo])
            await until(lambda: texts(fake, OWNER.uuid))
            assert "text only" in texts(fake, OWNER.uuid)[0]
            fake.message(OWNER, None, attachments=[{**photo, "caption": "a caption"}])
            fake.message(OWNER, "look at this", attachments=[photo])
            fake.message(OWNER, "changed my mind", edit_of=first)
            fake.message(OWNER, None, delete_of=first)
            await until(lambda: len(texts(fake, OWNER.uuid)) == 3)
            await asyncio.sleep(0.3)
            assert texts(fake, OWNER.uuid)[1:] == ["[Echo] a caption", "[Echo] look at this"]
    run(scenario())


def test_a_long_reply_is_split_under_the_limit(home, tmp_path):
    long = "\n\n".join(f"Paragraph {i}. " + "word " * 150 for i in range(6))
    reply = f'(:type :REQUEST :target :signal :chat-id "{OWNER.uuid}" :text "{long}")'

    async def scenario():
        async with bridge(home, script(tmp_path, reply)) as (fake, _, _):
            fake.message(OWNER, "tell me a lot")
            await until(lambda: sum(len(t) for t in texts(fake, OWNER.uuid)) >= len(long) - 50,
                        30)
            pieces = texts(fake, OWNER.uuid)
            assert len(pieces) >= 2 and all(len(p) <= 2000 for p in pieces)
            assert all(p.startswith("Paragraph") for p in pieces)
    run(scenario())


# -- approvals --------------------------------------------------------------------

async def shown_approval(fake, chat):
    await until(lambda: any("React" in s.text for s in fake.sent if s.chat_id == chat))
    return next(s for s in fake.sent if s.chat_id == chat and "React" in s.text)


def test_an_approval_approved_by_a_reaction_runs(home, tmp_path):
    async def scenario():
        owners = {f"signal:{OWNER.uuid}": "developer"}
        async with bridge(home, script(tmp_path, SHELL, AFTER),
                          owners=owners) as (fake, _, kernel):
            fake.message(OWNER, "run it")
            asked = await shown_approval(fake, OWNER.uuid)
            assert "echo approved-run" in asked.text
            fake.react(OWNER, asked, "\U0001F44D\U0001F3FD")      # 👍🏽
            await until(lambda: "after the command" in texts(fake, OWNER.uuid), 20)
            assert "Approved." in texts(fake, OWNER.uuid)
            assert STEP + "done" in texts(fake, OWNER.uuid)
            await until(lambda: asked.edits)
            assert "approved" in asked.edits[0]
            ran = await archived_step(kernel, Thread("signal", OWNER.uuid))
            assert "Shell: echo approved-run (exit 0)" in ran
    run(scenario())


def test_an_approval_denied_by_a_reply_to_it(home, tmp_path):
    async def scenario():
        owners = {f"signal:{OWNER.uuid}": "developer"}
        async with bridge(home, script(tmp_path, SHELL, AFTER),
                          owners=owners) as (fake, _, kernel):
            fake.message(OWNER, "run it")
            asked = await shown_approval(fake, OWNER.uuid)
            fake.message(OWNER, "Deny", quote=asked)
            await until(lambda: asked.edits, 20)
            await until(lambda: "after the command" in texts(fake, OWNER.uuid), 20)
            assert "denied" in asked.edits[0] and "Denied." in texts(fake, OWNER.uuid)
            assert STEP + "not approved" in texts(fake, OWNER.uuid)
            denied = await archived_step(kernel, Thread("signal", OWNER.uuid))
            assert denied == "denied by the owner"
    run(scenario())


def test_in_a_group_only_the_asker_decides_by_reaction(home, tmp_path):
    async def scenario():
        owners = {f"signal:{GROUP}": "developer"}
        async with bridge(home, script(tmp_path, SHELL, AFTER), owners=owners,
                          groups=[GROUP]) as (fake, _, kernel):
            said = fake.message(OWNER, "run it", group=GROUP, mention_bot=True)
            asked = await shown_approval(fake, GROUP)
            assert asked.quote == (OWNER.uuid, said)      # asked as the answer to "run it"
            fake.react(FRIEND, asked, "\u2705")
            await until(lambda: any("Only the person" in t for t in texts(fake, GROUP)))
            fake.react(OWNER, asked, "\u2764\ufe0f")              # ❤️ decides nothing
            fake.react(OWNER, asked, "\u274C")
            await until(lambda: asked.edits, 20)
            await until(lambda: "after the command" in texts(fake, GROUP), 20)
            assert "denied" in asked.edits[0] and "Denied." in texts(fake, GROUP)
            assert STEP + "not approved" in texts(fake, GROUP)
            assert await archived_step(kernel, Thread("signal", GROUP)) == "denied by the owner"
    run(scenario())


# -- failures ---------------------------------------------------------------------

def test_a_dropped_daemon_connection_is_reported_and_the_bridge_reconnects(home):
    async def scenario():
        async with bridge(home) as (fake, running, _):
            fake.message(OWNER, "first")
            await until(lambda: texts(fake, OWNER.uuid))
            fake.drop()
            fake.message(OWNER, "second")            # waits on "Signal's server" meanwhile
            await until(lambda: len(texts(fake, OWNER.uuid)) == 2, 30)
            assert texts(fake, OWNER.uuid) == ["[Echo] first", "[Echo] second"]
            assert running.status["errors"] >= 1
            assert "lost the connection to signal-cli" in running.status["last_error"]
            assert fake.calls.count("subscribeReceive") == 2
            await until(lambda: running.status["state"] == "running")
    run(scenario())


def test_after_a_restart_new_messages_are_taken(home):
    async def scenario():
        for word in ("before", "after"):
            async with bridge(home) as (fake, _, _):
                fake.message(OWNER, word)
                await until(lambda: texts(fake, OWNER.uuid))
                assert texts(fake, OWNER.uuid) == [f"[Echo] {word}"]
    run(scenario())


@pytest.mark.parametrize("code,message,expected", [
    (-32602, "Method requires valid account parameter", "set [bridges.signal] account"),
    (-3, "signal-cli version is too old for the Signal-Server, please update.",
     "update signal-cli"),
])
def test_a_json_rpc_error_object_is_a_clear_error(home, code, message, expected):
    async def scenario():
        fake = FakeSignalCli()
        fake.fail("subscribeReceive", code, message)
        address = await fake.start()
        kernel = build_kernel(load_config(home), backend=EchoBackend())
        settings = SignalSettings(enabled=True, address=address, allow=[OWNER.uuid])
        running = Bridge(SignalPlatform(settings), settings, kernel,
                         Inbox(home / "inbox.jsonl"), 30.0)
        stop = asyncio.Event()
        task = asyncio.create_task(running.run(stop))
        try:
            await until(lambda: running.status["errors"] >= 1)
            assert expected in running.status["last_error"]
            assert expected in running.report()
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await kernel.aclose()
            await fake.stop()
    run(scenario())


def test_a_receive_exception_saying_too_old_is_reported(home):
    async def scenario():
        async with bridge(home) as (fake, running, _):
            await until(lambda: "subscribeReceive" in fake.calls)
            fake.receive_exception("Deprecated version", "DeprecatedVersionException")
            await until(lambda: running.status["errors"] >= 1)
            assert "update signal-cli" in running.status["last_error"]
    run(scenario())


def test_a_rate_limit_is_honoured_and_refused_styles_fall_back_to_plain(home):
    async def scenario():
        async with bridge(home) as (fake, _, _):
            fake.fail("send", 0, error=rate_limited(1))
            fake.fail("send", -1, "Invalid style: BOLDER")
            fake.message(OWNER, "*bold* <tag>")
            await until(lambda: texts(fake, OWNER.uuid), 20)
            reply = next(s for s in fake.sent if s.chat_id == OWNER.uuid)
            assert (reply.text, reply.styles) == ("[Echo] *bold* <tag>", [])
            assert fake.calls.count("send") == 3
    run(scenario())
