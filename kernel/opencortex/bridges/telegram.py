"""Telegram through python-telegram-bot's `Bot` (the Bot API): the platform protocol only.

Long polling with `getUpdates` by default: the offset moves past a batch only
after the bridge has kept it (`acknowledge`), so nothing fetched is lost in a
crash.  A webhook left set on the bot would make every `getUpdates` fail: it is
reported and removed when polling starts (pending updates are kept).

With `webhook_url` set, the two being exclusive, `getUpdates` is never called:
`start` listens (`telegram_webhook.WebhookReceiver`) and calls `setWebhook`
with the secret token from $webhook_secret_env; Telegram's POSTs are answered
200 once the bridge has kept their update.  `stop` leaves the webhook set, so
Telegram holds updates while the kernel restarts.  Both modes read an update
with the same `_item`.

A message in a forum topic (`is_topic_message`) is the topic's conversation:
what the bridge says there (replies, typing, approvals) carries its
`message_thread_id`, as python-telegram-bot's `Message.reply_text` does; a
chain of replies in a group without topics stays the group's one conversation.

In a group, a reply quotes the message it answers (`reply_parameters`).  Replies
are sent as HTML (`parse_mode`), approvals carry an inline keyboard
whose callback data binds the click to the approval and the action's digest,
and every click is answered with `answerCallbackQuery`.

The token is never logged and never part of an error: python-telegram-bot and
httpx put it in request URLs, so their loggers are kept at WARNING and every
error text is scrubbed of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opencortex.bridges.contract import (BridgeError, Decision, FormattingRejected, Platform,
                                         Unreadable)
from opencortex.bridges.inbound import Inbound, split_conversation
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.settings import TelegramSettings
from opencortex.events import topic_chat_id

TEXT_LIMIT = 4000         # characters a piece: the Bot API takes 4096 of text per message

if TYPE_CHECKING:   # imported when webhook mode starts (it needs aiohttp)
    from opencortex.bridges.telegram_webhook import WebhookReceiver

log = logging.getLogger(__name__)

for _name in ("httpx", "httpcore", "telegram"):   # they log request URLs, token included
    logging.getLogger(_name).setLevel(logging.WARNING)

MEDIA = ("photo", "voice", "audio", "video", "video_note", "document", "sticker",
         "animation", "location", "contact", "poll")
UPDATES = ["message", "edited_message", "callback_query"]
SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")   # what setWebhook accepts as secret_token
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class TelegramPlatform(Platform):
    """One bot on the Bot API."""

    channel = "telegram"
    text_limit = TEXT_LIMIT
    per_chat = 1.0        # about one message a second in one chat
    per_second = 25.0     # and at most 30 a second overall

    def __init__(self, settings: TelegramSettings, token: str):
        from telegram import Bot
        from telegram.request import HTTPXRequest
        self.settings = settings
        self._token = token
        self.bot = Bot(token, base_url=settings.base_url,
                       request=HTTPXRequest(connection_pool_size=16, pool_timeout=30.0),
                       get_updates_request=HTTPXRequest(
                           read_timeout=settings.poll_timeout + 10.0))
        self.username = ""
        self._fetched: int | None = None   # the last update id fetched
        self._offset: int | None = None    # what getUpdates asks from
        self.receiver: WebhookReceiver | None = None   # in webhook mode
        self._unreadable = Unreadable("telegram")

    # -- errors -----------------------------------------------------------------

    def _scrub(self, error: BaseException) -> str:
        text = f"{type(error).__name__}: {error}"
        return text.replace(self._token, "<token>") if self._token else text

    def _failure(self, error: Exception, doing: str) -> Exception:
        """The contract's exception for a python-telegram-bot error while DOING."""
        from telegram import error as tg
        if isinstance(error, tg.RetryAfter):
            with warnings.catch_warnings():   # v22.2+: an int now, a timedelta later
                warnings.simplefilter("ignore")
                seconds = error.retry_after
            return RetryAfter(seconds.total_seconds() if isinstance(seconds, timedelta)
                              else float(seconds))
        if isinstance(error, tg.BadRequest) and "parse entities" in str(error).lower():
            return FormattingRejected(self._scrub(error))
        if isinstance(error, tg.InvalidToken):
            return BridgeError("Telegram rejected the bot token; check the variable named by "
                               "[bridges.telegram] token_env", fatal=True)
        if isinstance(error, tg.Conflict):
            return BridgeError("another program is polling this bot, or a webhook is set "
                               "(Telegram: Conflict); stop it, or remove the webhook")
        return BridgeError(f"Telegram {doing} failed ({self._scrub(error)})")

    async def _call(self, doing: str, coroutine: Any) -> Any:
        from telegram.error import TelegramError
        try:
            return await coroutine
        except TelegramError as error:
            raise self._failure(error, doing) from None

    # -- the contract -----------------------------------------------------------

    async def start(self) -> str:
        secret = self._webhook_secret() if self.settings.webhook_url else ""
        await self._call("getMe", self.bot.initialize())
        self.username = self.bot.username or ""
        if secret:
            await self._start_webhook(secret)
        else:
            await self._remove_webhook()
        return self.username

    async def _remove_webhook(self) -> None:
        """Polling: a webhook left set (by webhook mode, or another program) is removed."""
        info = await self._call("getWebhookInfo", self.bot.get_webhook_info())
        if info.url:
            log.warning("telegram: a webhook is set for this bot; long polling cannot run "
                        "while it is, so it is removed (pending updates are kept)")
            await self._call("deleteWebhook", self.bot.delete_webhook(drop_pending_updates=False))

    def _webhook_secret(self) -> str:
        """The secret token from $webhook_secret_env; BridgeError if unset or malformed."""
        name = self.settings.webhook_secret_env
        secret = os.environ.get(name, "") if name else ""
        rule = "1-256 characters of A-Z a-z 0-9 _ -"
        if not secret:
            raise BridgeError(f"[bridges.telegram] webhook_url is set but the secret token "
                              f"${name or '(webhook_secret_env is empty)'} is not set; export "
                              f"{rule} in it (e.g. `openssl rand -hex 32`)", fatal=True)
        if not SECRET_TOKEN.fullmatch(secret):
            raise BridgeError(f"${name} is not a webhook secret token Telegram accepts: it "
                              f"takes {rule}", fatal=True)
        return secret

    async def _start_webhook(self, secret: str) -> None:
        """Listen for Telegram's POSTs, then point the bot's webhook at webhook_url."""
        from opencortex.bridges.telegram_webhook import WebhookReceiver
        settings = self.settings
        path = settings.webhook_path or urlsplit(settings.webhook_url).path or "/"
        if self.receiver is None:
            self.receiver = WebhookReceiver(settings.webhook_listen, settings.webhook_port,
                                            path, secret, self._parse)
        try:
            await self.receiver.start()
        except OSError as error:
            raise BridgeError(f"cannot listen on {settings.webhook_listen}:"
                              f"{settings.webhook_port} for the webhook "
                              f"({error.strerror or type(error).__name__})") from None
        if settings.webhook_listen not in LOOPBACK:
            log.warning("telegram: the webhook receiver speaks plain HTTP on %s; expose it "
                        "only through a reverse proxy that terminates TLS",
                        settings.webhook_listen)
        # One request in flight: updates of different chats cannot overtake each other
        # on parallel connections (each chat's turns run in the order kept).
        await self._call("setWebhook", self.bot.set_webhook(
            settings.webhook_url, max_connections=1, allowed_updates=UPDATES,
            drop_pending_updates=False, secret_token=secret))
        log.info("telegram: webhook set; receiving updates on %s:%d",
                 settings.webhook_listen, self.receiver.port)

    async def register_commands(self, commands: list[tuple[str, str]]) -> None:
        from telegram import BotCommand
        menu = [BotCommand(name, description[:256] or name) for name, description in commands
                if name.isascii() and name.replace("_", "").isalnum() and len(name) <= 32]
        await self._call("setMyCommands", self.bot.set_my_commands(menu[:100]))

    async def fetch(self) -> list[Inbound | Decision]:
        if self.receiver is not None:   # webhook mode: what Telegram POSTed
            return await self.receiver.take(max(1, self.settings.poll_timeout))
        # Raw, each update then read alone as the webhook reads it: `Bot.get_updates`
        # parses the batch at once, so an update it cannot read fails every update with
        # it, on every poll (the bridge never gets past it), and it logs the batch's raw
        # data, message text included, at CRITICAL.  `_post` is the call get_updates
        # makes before parsing (python-telegram-bot 22, which pyproject pins).
        updates = await self._call("getUpdates", self.bot._post("getUpdates", {
            "offset": self._offset, "timeout": self.settings.poll_timeout,
            "allowed_updates": UPDATES}, read_timeout=self.settings.poll_timeout + 10.0))
        items: list[Inbound | Decision] = []
        for data in updates if isinstance(updates, list) else ():
            update_id = data.get("update_id") if isinstance(data, dict) else None
            if type(update_id) is not int:
                continue         # Telegram numbers every update: nothing to confirm here
            self._fetched = update_id   # in order: the last is confirmed (ids may restart)
            with self._unreadable.skipped(f"update {update_id}"):
                item = self._parse(data)
                if item is not None:
                    items.append(item)
        return items

    async def acknowledge(self) -> None:
        if self.receiver is not None:   # Telegram's requests are answered 200
            self.receiver.confirm()
        elif self._fetched is not None:
            self._offset = self._fetched + 1

    async def send(self, chat_id: str, html: str, plain: str, key: str | None = None,
                   reply_to: str | None = None) -> None:
        # the Bot API's sendMessage has no idempotency key: KEY cannot be used
        from telegram import LinkPreviewOptions
        chat, options = _answering(chat_id, reply_to)
        options["link_preview_options"] = LinkPreviewOptions(is_disabled=True)
        if html:
            await self._call("sendMessage", self.bot.send_message(
                chat, html, parse_mode="HTML", **options))
        else:
            await self._call("sendMessage", self.bot.send_message(chat, plain, **options))

    async def typing(self, chat_id: str) -> None:
        chat, options = _answering(chat_id)
        await self._call("sendChatAction", self.bot.send_chat_action(chat, "typing", **options))

    async def show_approval(self, chat_id: str, text: str, approval_id: str,
                            digest: str, reply_to: str | None = None) -> Any:
        from telegram import InlineKeyboardButton, InlineKeyboardMarkup
        keyboard = InlineKeyboardMarkup([[
            InlineKeyboardButton("Approve", callback_data=f"a:{approval_id}:{digest}:y"),
            InlineKeyboardButton("Deny", callback_data=f"a:{approval_id}:{digest}:n")]])
        chat, options = _answering(chat_id, reply_to)
        sent = await self._call("sendMessage", self.bot.send_message(
            chat, text, reply_markup=keyboard, **options))
        return sent.message_id, text

    async def settle_approval(self, chat_id: str, handle: Any, outcome: str) -> None:
        message_id, text = handle
        await self._call("editMessageText", self.bot.edit_message_text(
            f"{text}\n\n{outcome}", chat_id=split_conversation(chat_id)[0],
            message_id=message_id))

    async def answer_decision(self, decision: Decision, text: str) -> None:
        if decision.token:
            await self._call("answerCallbackQuery", self.bot.answer_callback_query(
                decision.token, text=text))

    async def stop(self) -> None:
        if self.receiver is not None:   # the webhook stays set: Telegram holds the updates
            receiver, self.receiver = self.receiver, None
            await receiver.stop()
        try:
            await asyncio.wait_for(self.bot.shutdown(), 10)
        except Exception as error:   # closing connections must not stop the kernel's exit
            log.info("telegram: shutdown: %s", self._scrub(error))

    # -- updates ----------------------------------------------------------------

    def _parse(self, data: dict[str, Any]) -> Inbound | Decision | None:
        """One update as Telegram sends it (a JSON object, polled or POSTed)."""
        from telegram import Update
        return self._item(Update.de_json(data, self.bot))

    def _item(self, update: Any) -> Inbound | Decision | None:
        """What the bridge sees of one python-telegram-bot `Update` (None: nothing)."""
        if update.callback_query is not None:
            return self._decision(update)
        message = update.message or update.edited_message
        if message is None or message.chat is None or message.from_user is None:
            return None
        kind = "edit" if update.edited_message is not None else self._kind(message)
        text = message.text or message.caption or ""
        return Inbound(position=update.update_id, chat_id=str(message.chat.id),
                       sender_id=str(message.from_user.id), message_id=str(message.message_id),
                       text=text, kind=kind, is_group=message.chat.type in ("group", "supergroup"),
                       addressed_to_bot=self._addressed(message, text),
                       sender_name=message.from_user.full_name or "",
                       sent_at=message.date.timestamp() if message.date else None,
                       topic=_topic(message))

    @staticmethod
    def _kind(message: Any) -> str:
        if message.text is not None:
            return "text"
        return "media" if any(getattr(message, name, None) for name in MEDIA) else "other"

    def _addressed(self, message: Any, text: str) -> bool:
        """In a group: does MESSAGE mention the bot or reply to one of its messages?  (In a
        forum topic every message replies to the topic's first, "topic created": not a
        reply to whoever created it.)"""
        replied = message.reply_to_message
        if replied is not None and replied.from_user is not None and \
                replied.from_user.id == self.bot.id and replied.forum_topic_created is None:
            return True
        mention = f"@{self.username}".lower()
        return bool(self.username) and mention in text.lower()

    def _decision(self, update: Any) -> Decision:
        """Every click becomes a Decision (a malformed one names no approval), so every
        click is answered."""
        query = update.callback_query
        parts = (query.data or "").split(":")
        valid = len(parts) == 4 and parts[0] == "a" and parts[3] in ("y", "n")
        shown = query.message
        chat = topic_chat_id(str(shown.chat.id), _topic(shown)) if shown is not None else ""
        return Decision(position=update.update_id, chat_id=chat,
                        sender_id=str(query.from_user.id),
                        approval_id=parts[1] if valid else "", digest=parts[2] if valid else "",
                        approve=valid and parts[3] == "y", token=query.id)


def _topic(message: Any) -> str:
    """The forum topic MESSAGE was written in, as text ("" outside topics).  Telegram
    numbers a reply chain in a group without topics as well; only a topic message's
    number is a place to answer in (`is_topic_message`)."""
    number = getattr(message, "message_thread_id", None)
    if getattr(message, "is_topic_message", None) is not True or type(number) is not int:
        return ""
    return str(number) if 0 < number < 2 ** 63 else ""


def _answering(conversation: str, reply_to: str | None = None) -> tuple[str, dict[str, Any]]:
    """Where to send to CONVERSATION: its chat, and the options that put a message in its
    topic and, in a group (Telegram numbers groups below zero), quote the message
    REPLY_TO it answers, as python-telegram-bot's reply_text does (sent even if that
    message is gone)."""
    from telegram import ReplyParameters
    chat, topic = split_conversation(conversation)
    numbered = topic.isascii() and topic.isdigit()     # as `_topic` makes them
    options: dict[str, Any] = {"message_thread_id": int(topic) if numbered else None}
    if reply_to and reply_to.isascii() and reply_to.isdigit() and chat.startswith("-"):
        options["reply_parameters"] = ReplyParameters(int(reply_to),
                                                      allow_sending_without_reply=True)
    return chat, options
