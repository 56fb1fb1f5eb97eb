"""Telegram groups: a reply quotes what it answers; a forum's topics are each a
conversation of its own, answered in that topic, while who may talk, and who
they are, is decided by the group (the real python-telegram-bot against the
loopback fake Bot API)."""

from __future__ import annotations

import asyncio

import pytest

from opencortex.bridges import service
from opencortex.bridges.inbound import Inbound, split_conversation
from opencortex.bridges.inbox import Inbox
from opencortex.conversation.recall import owner_of
from opencortex.events import Thread, chat_of, topic_chat_id
from opencortex.llm.routing import archetype_for
from opencortex.llm.settings import LLMSettings
from opencortex.memory.partitions import default_partition

from bridge_helpers import run, script, until
from telegram_fake import BOT_ID, BOT_NAME
from test_telegram import AFTER, GROUP, OWNER, SHELL, STEP, bridge, buttons, texts

APPLES, PEARS = 5, 9      # two topics of the forum GROUP


def said_in(fake, topic: int | None) -> list[str]:
    """What the bot said in GROUP's TOPIC (None: outside every topic)."""
    return [s.text for s in fake.sent if s.chat_id == str(GROUP) and s.topic == topic]


def test_each_topic_is_a_conversation_of_its_own_answered_in_its_topic(home, monkeypatch):
    monkeypatch.setattr(service, "TYPING_AFTER", 0.0)

    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, running, kernel):
            say = dict(chat_id=GROUP, chat_type="supergroup")
            fake.send(OWNER, f"@{BOT_NAME} apples are ripe", topic=APPLES, **say)
            fake.send(OWNER, f"@{BOT_NAME} pears are hard", topic=PEARS, **say)
            fake.send(OWNER, f"@{BOT_NAME} hello everyone", **say)      # the General topic
            await until(lambda: len([s for s in fake.sent if s.chat_id == str(GROUP)]) == 3)
            assert said_in(fake, APPLES) == [f"[Echo] @{BOT_NAME} apples are ripe"]
            assert said_in(fake, PEARS) == [f"[Echo] @{BOT_NAME} pears are hard"]
            assert said_in(fake, None) == [f"[Echo] @{BOT_NAME} hello everyone"]
            assert set(fake.action_topics) <= {APPLES, PEARS, None} and fake.action_topics
            threads = {str(t) for t in kernel.archive.threads()}
            assert threads == {f"telegram:{GROUP}", f"telegram:{GROUP}#{APPLES}",
                               f"telegram:{GROUP}#{PEARS}"}
            fake.send(OWNER, f"/history@{BOT_NAME}", topic=PEARS, **say)
            await until(lambda: len(said_in(fake, PEARS)) == 2)
            history = said_in(fake, PEARS)[1]
            assert "pears" in history and "apples" not in history and "everyone" not in history
            # one group: its topics are one owner, whose memories each topic recalls
            recall = kernel.conversations.recall
            topic = Thread("telegram", f"{GROUP}#{PEARS}")
            assert recall.owner(topic) == f"telegram:{GROUP}"
            hits = recall.recall(topic, "which fruit is ripe", k=3)
            assert any("apples are ripe" in hit.text for hit in hits)
            assert running.gate.counts["allowed"] == 4
    run(scenario())


def test_in_a_group_a_reply_quotes_the_message_it_answers_and_in_private_not(home):
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, _, _):
            asked = fake.send(OWNER, f"@{BOT_NAME} which one?", chat_id=GROUP,
                              chat_type="supergroup", topic=APPLES)
            private = fake.send(OWNER, "just us")
            await until(lambda: said_in(fake, APPLES) and texts(fake, OWNER))
            [answer] = [s for s in fake.sent if s.chat_id == str(GROUP)]
            assert (answer.reply_to, answer.topic) == (asked, APPLES)
            assert [s.reply_to for s in fake.sent if s.chat_id == str(OWNER)] == [None]
            assert private
    run(scenario())


def test_the_bridges_own_notice_answers_the_message_it_is_about_in_its_topic(home):
    """A photo without a caption, replying to the bot in a topic: "text only" is said in
    that topic, quoting the photo (in a group several people may have sent one)."""
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, _, _):
            photo = fake.send(OWNER, None, chat_id=GROUP, chat_type="supergroup",
                              topic=PEARS, reply_to_bot=True, photo=[
                                  {"file_id": "p", "file_unique_id": "u", "width": 1,
                                   "height": 1}])
            await until(lambda: said_in(fake, PEARS))
            [notice] = [s for s in fake.sent if s.chat_id == str(GROUP)]
            assert "text only" in notice.text
            assert (notice.topic, notice.reply_to) == (PEARS, photo)
    run(scenario())


def test_a_reply_chain_in_a_group_without_topics_is_answered_in_the_group(home):
    """Telegram numbers a chain of replies too (message_thread_id without
    is_topic_message); sending to that number fails there ("for forum supergroups
    only"), and the chain is the group's one conversation."""
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, _, kernel):
            fake.send(OWNER, f"@{BOT_NAME} in a chain", chat_id=GROUP, chat_type="supergroup",
                      message_thread_id=77)
            await until(lambda: said_in(fake, None))
            assert said_in(fake, None) == [f"[Echo] @{BOT_NAME} in a chain"]
            assert {str(t) for t in kernel.archive.threads()} == {f"telegram:{GROUP}"}
    run(scenario())


def test_a_topic_the_bot_created_does_not_make_every_message_in_it_addressed(home):
    """In a topic every message replies to the topic's first ("topic created"); when
    the bot created the topic, that is no reply to the bot."""
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, running, _):
            by_bot = {"message_id": APPLES, "date": 1, "forum_topic_created": {
                "name": "bot's", "icon_color": 7322096},
                "chat": {"id": GROUP, "type": "supergroup", "is_forum": True},
                "from": {"id": BOT_ID, "is_bot": True, "first_name": "Cortex"}}
            say = dict(chat_id=GROUP, chat_type="supergroup", topic=APPLES,
                       reply_to_message=by_bot)
            fake.send(OWNER, "talking among ourselves", **say)
            fake.send(OWNER, f"@{BOT_NAME} now you", **say)
            await until(lambda: said_in(fake, APPLES))
            await asyncio.sleep(0.3)
            assert said_in(fake, APPLES) == [f"[Echo] @{BOT_NAME} now you"]
            assert running.gate.counts["group-not-addressed"] == 1
    run(scenario())


def test_an_owner_group_is_an_owner_in_its_topics_and_approves_there(home, tmp_path):
    """[llm.owners] naming the group names its topics: a command asks for approval in
    the topic it was asked in, and runs once approved there."""
    async def scenario():
        owners = {f"telegram:{GROUP}": "developer"}
        async with bridge(home, script(tmp_path, SHELL, AFTER), owners=owners,
                          groups=[str(GROUP)]) as (fake, _, _):
            said = fake.send(OWNER, f"@{BOT_NAME} run it", chat_id=GROUP,
                             chat_type="supergroup", topic=APPLES)
            await until(lambda: any(s.reply_markup for s in fake.sent))
            asked = next(s for s in fake.sent if s.reply_markup)
            assert asked.topic == APPLES and "echo approved-run" in asked.text
            assert asked.reply_to == said                  # asked as the answer to "run it"
            fake.click(OWNER, asked, buttons(asked)[0])
            await until(lambda: "after the command" in said_in(fake, APPLES), 20)
            assert "approved" in asked.edits[0]
            assert STEP + "done" in said_in(fake, APPLES)
            assert not said_in(fake, None)
    run(scenario())


def test_a_topic_is_a_numbered_part_of_a_numbered_chat():
    assert topic_chat_id("-1001", "5") == "-1001#5" and topic_chat_id("-1001", "") == "-1001"
    assert Thread("telegram", "-1001#5").chat == Thread("telegram", "-1001")
    assert Thread("telegram", "-1001").chat == Thread("telegram", "-1001")
    assert chat_of("-1001#5") == "-1001"
    for other in ("!room#5:example.org", "group.ab#5", "#5", "-1001#", "-1001#5#6",
                  "-1001#٥", "a-1001#5"):           # Matrix, Signal, odd: not a topic
        assert chat_of(other) == other and Thread("matrix", other).chat.chat_id == other
    for chat, topic in (("-1001", "x"), ("!room:x", "5"), ("-1001", "5#6"), ("1", "-5")):
        with pytest.raises(ValueError):
            topic_chat_id(chat, topic)
    with pytest.raises(ValueError):
        Inbound(position=1, chat_id="-1001", sender_id="7", message_id="1", topic="5/6")
    assert split_conversation("-1001#5") == ("-1001", "5")
    assert split_conversation("-1001") == ("-1001", "")


def test_configuration_naming_a_chat_names_its_topics_and_a_topic_may_differ():
    topic, other = Thread("telegram", "-1001#5"), Thread("telegram", "-1001#6")
    assert default_partition(topic) == "telegram:-1001"
    owners = {"telegram:-1001": "team", "telegram:-1001#6": "secret"}
    assert owner_of(topic, owners) == "team" and owner_of(other, owners) == "secret"
    llm = LLMSettings(owners={"telegram:-1001": "developer", "telegram:-1001#6": "guest"})
    assert archetype_for(topic, llm) == "developer" and archetype_for(other, llm) == "guest"
    # a stranger's chat that merely starts like an owner's is not one
    assert archetype_for(Thread("telegram", "-10011#5"), llm) == "guest"


@pytest.mark.parametrize("thread_id, is_topic", [
    ("5", True), (True, True), (-3, True), (0, True), (5, False), (5, None), (2 ** 70, True)])
def test_only_a_topic_message_with_a_topic_number_is_answered_in_a_topic(home, thread_id,
                                                                         is_topic):
    """What Telegram could send as message_thread_id and is_topic_message: only a
    positive whole number in a topic message is a topic; the rest is the group's."""
    async def scenario():
        async with bridge(home, groups=[str(GROUP)]) as (fake, _, kernel):
            extra = {"message_thread_id": thread_id}
            if is_topic is not None:
                extra["is_topic_message"] = is_topic
            fake.send(OWNER, f"@{BOT_NAME} odd", chat_id=GROUP, chat_type="supergroup",
                      **extra)
            fake.send(OWNER, f"@{BOT_NAME} after it", chat_id=GROUP, chat_type="supergroup")
            await until(lambda: len(said_in(fake, None)) == 2 or
                        f"[Echo] @{BOT_NAME} after it" in said_in(fake, None))
            assert said_in(fake, None)[-1] == f"[Echo] @{BOT_NAME} after it"
            assert {str(t) for t in kernel.archive.threads()} == {f"telegram:{GROUP}"}
    run(scenario())


def test_a_topic_message_kept_in_the_inbox_comes_back_with_its_topic(tmp_path):
    path = tmp_path / "telegram.inbox.jsonl"
    inbox = Inbox(path)
    message = Inbound(position=3, chat_id="-1001", sender_id="7", message_id="10",
                      text="hi", is_group=True, topic="5")
    inbox.add([message])
    inbox.close()
    again = Inbox(path)
    try:
        assert again.pending() == [message] and again.pending()[0].conversation == "-1001#5"
    finally:
        again.close()
