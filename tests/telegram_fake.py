"""A loopback fake of the Telegram Bot API, as python-telegram-bot uses it.

It follows the documented HTTP API (https://core.telegram.org/bots/api): every
method is `POST /bot<token>/<method>` with form-encoded or JSON parameters
(python-telegram-bot sends objects such as `reply_markup` as JSON strings),
and every answer is `{"ok": true, "result": …}` or `{"ok": false,
"error_code": …, "description": …, "parameters": {"retry_after": …}}`.
`getUpdates` long-polls: updates below `offset` are confirmed and forgotten,
and the call waits up to `timeout` seconds for new ones.  While a webhook is
set (`setWebhook` with `url`, `secret_token`, `allowed_updates`,
`max_connections`, `drop_pending_updates`; removed by `deleteWebhook` or an
empty `url`), `getUpdates` fails with 409 Conflict, as Telegram's does; the
fake does not POST to the webhook: a test does, with `message_update`.

People are simulated with `send` (a message from a user) and `click` (a
callback query on an inline button).  A message sent with `topic` is written
in that forum topic of its supergroup (`is_topic_message`, `message_thread_id`,
and a reply to the topic's "topic created" message, as Telegram delivers one);
`sendMessage` and `sendChatAction` take `message_thread_id` only for a topic
the fake has seen ("for forum supergroups only"), else 400 "message thread
not found".  Faults are injected per method with
`fail(method, kind)`: "429" (retry_after 1), "500", "drop" (the connection is
closed without an answer), "parse" (400 can't parse entities).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BOT_ID = 4242
BOT_NAME = "cortex_test_bot"


@dataclass
class Sent:
    chat_id: str
    text: str
    parse_mode: str | None
    message_id: int
    reply_markup: Any = None
    topic: int | None = None          # the message_thread_id it was sent with
    reply_to: int | None = None       # the message it answers (reply_parameters)
    edits: list[str] = field(default_factory=list)
    date: int = field(default_factory=lambda: int(time.time()))   # Telegram's, whole seconds


class FakeBotApi:
    """The Bot API for one bot token, on 127.0.0.1."""

    def __init__(self, token: str):
        self.token = token
        self.updates: list[dict[str, Any]] = []
        self.next_update = 1
        self.next_message = 1000
        self.sent: list[Sent] = []
        self.actions: list[tuple[str, str]] = []
        self.action_topics: list[int | None] = []   # each action's message_thread_id
        self.topics: set[tuple[str, int]] = set()    # (chat id, topic) of forum topics seen
        self.answers: list[tuple[str, str]] = []
        self.commands: list[dict[str, str]] = []
        self.calls: list[str] = []
        self.webhook_url = ""
        self.webhook_secret = ""
        self.webhook_allowed: list[str] | None = None
        self.webhook_max_connections = 40
        self.faults: dict[str, list[str]] = {}
        self.on_sent: Any = None      # called with each Sent as it arrives (benchmarks)
        self.confirmed = 0            # highest update id confirmed by an offset
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/bot{token}/{method}", self._route)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}/bot"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- people ------------------------------------------------------------------

    def send(self, user_id: int, text: str | None = None, **options: Any) -> int:
        """A message from USER_ID, queued for getUpdates (options: `message_update`'s);
        its message id."""
        update = self.message_update(user_id, text, **options)
        self.updates.append(update)
        self._arrived.set()
        return (update.get("message") or update["edited_message"])["message_id"]

    def message_update(self, user_id: int, text: str | None = None, *,
                       chat_id: int | None = None, chat_type: str = "private",
                       reply_to_bot: bool = False, edited: bool = False,
                       topic: int | None = None, **media: Any) -> dict[str, Any]:
        """The update carrying a message from USER_ID (in CHAT_ID, default their private
        chat; in its forum TOPIC when given), with the next update id, as Telegram
        delivers it; not queued."""
        chat = chat_id if chat_id is not None else user_id
        message: dict[str, Any] = {
            "message_id": self._message_id(), "date": int(time.time()),
            "chat": {"id": chat, "type": chat_type, "title": "group"} if chat_type != "private"
            else {"id": chat, "type": "private", "first_name": f"user{user_id}"},
            "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"}}
        if text is not None:
            message["text"] = text
        if topic is not None:
            self.topics.add((str(chat), topic))
            message["chat"]["is_forum"] = True
            message.update({"message_thread_id": topic, "is_topic_message": True,
                            "reply_to_message": {   # the topic's first message
                                "message_id": topic, "date": int(time.time()),
                                "chat": message["chat"], "message_thread_id": topic,
                                "from": {"id": user_id, "is_bot": False,
                                         "first_name": f"user{user_id}"},
                                "forum_topic_created": {"name": f"topic {topic}",
                                                        "icon_color": 7322096}}})
        message.update(media)
        if reply_to_bot:
            message["reply_to_message"] = {
                "message_id": 1, "date": int(time.time()), "chat": message["chat"],
                "from": {"id": BOT_ID, "is_bot": True, "first_name": "Cortex",
                         "username": BOT_NAME}, "text": "earlier"}
        update = {"update_id": self.next_update, "edited_message" if edited else "message":
                  message}
        self.next_update += 1
        return update

    def click(self, user_id: int, sent: Sent, data: str) -> None:
        """USER_ID presses the inline button carrying DATA under the message SENT."""
        self._push({"callback_query": {
            "id": f"cb{self.next_update}", "chat_instance": "1", "data": data,
            "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
            "message": {"message_id": sent.message_id, "date": int(time.time()),
                        "chat": {"id": int(sent.chat_id), "type": "private"},
                        "from": {"id": BOT_ID, "is_bot": True, "first_name": "Cortex"},
                        "text": sent.text}}})

    def fail(self, method: str, *kinds: str) -> None:
        """Make the next calls of METHOD fail with KINDS, in order."""
        self.faults.setdefault(method, []).extend(kinds)

    def _push(self, update: dict[str, Any]) -> None:
        update["update_id"] = self.next_update
        self.next_update += 1
        self.updates.append(update)
        self._arrived.set()

    def _message_id(self) -> int:
        self.next_message += 1
        return self.next_message

    # -- the HTTP API ------------------------------------------------------------

    async def _route(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        method = request.match_info["method"]
        self.calls.append(method)
        try:
            params = await _params(request)
        except ConnectionResetError:        # the client went away mid-request (shutdown)
            return web.Response(status=400)
        fault = self.faults.get(method, [None]).pop(0) if self.faults.get(method) else None
        if fault == "429":
            return _error(429, "Too Many Requests: retry after 1", {"retry_after": 1})
        if fault == "500":
            return _error(500, "Internal Server Error")
        if fault == "drop":
            request.transport.close()
            return web.Response()
        if fault == "parse" and params.get("parse_mode"):
            return _error(400, "Bad Request: can't parse entities: unsupported start tag")
        handler = getattr(self, "_" + method, None)
        if handler is None:
            return _error(404, "Not Found: method not found")
        result = await handler(params)
        if isinstance(result, web.Response):
            return result
        return web.json_response({"ok": True, "result": result})

    async def _getMe(self, params: dict) -> dict:
        return {"id": BOT_ID, "is_bot": True, "first_name": "Cortex", "username": BOT_NAME,
                "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}

    async def _getWebhookInfo(self, params: dict) -> dict:
        info = {"url": self.webhook_url, "has_custom_certificate": False,
                "pending_update_count": len(self.updates)}
        if self.webhook_url:
            info["max_connections"] = self.webhook_max_connections
            if self.webhook_allowed is not None:
                info["allowed_updates"] = self.webhook_allowed
        return info

    async def _deleteWebhook(self, params: dict) -> bool:
        self.webhook_url = self.webhook_secret = ""
        if _flag(params.get("drop_pending_updates")):
            self.updates.clear()
        return True

    async def _setWebhook(self, params: dict) -> bool | web.Response:
        url = str(params.get("url", ""))
        secret = str(params.get("secret_token") or "")
        if url and not url.startswith("https://"):
            return _error(400, "Bad Request: bad webhook: An HTTPS URL must be provided for "
                          "webhook")
        if secret and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
            return _error(400, "Bad Request: secret token contains unallowed characters")
        if params.get("allowed_updates") is not None:
            allowed = params["allowed_updates"]
            self.webhook_allowed = json.loads(allowed) if isinstance(allowed, str) else allowed
        self.webhook_max_connections = int(params.get("max_connections") or 40)
        self.webhook_url, self.webhook_secret = url, secret if url else ""
        if _flag(params.get("drop_pending_updates")):
            self.updates.clear()
        return True

    async def _setMyCommands(self, params: dict) -> bool:
        self.commands = json.loads(params["commands"]) if isinstance(params["commands"], str) \
            else params["commands"]
        return True

    async def _getUpdates(self, params: dict) -> list | web.Response:
        if self.webhook_url:
            return _error(409, "Conflict: can't use getUpdates method while webhook is active")
        offset = int(params.get("offset") or 0)
        if offset:
            self.confirmed = max(self.confirmed, offset - 1)
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        deadline = time.monotonic() + min(float(params.get("timeout") or 0), 5.0)
        while not self.updates and time.monotonic() < deadline:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                break
        return list(self.updates[:int(params.get("limit") or 100)])

    async def _sendMessage(self, params: dict) -> dict | web.Response:
        topic = self._topic(params)
        if topic == -1:
            return _error(400, "Bad Request: message thread not found")
        answers = params.get("reply_parameters")
        if isinstance(answers, str):
            answers = json.loads(answers)
        sent = Sent(str(params["chat_id"]), params["text"], params.get("parse_mode"),
                    self._message_id(), params.get("reply_markup"), topic,
                    answers["message_id"] if isinstance(answers, dict) else None)
        self.sent.append(sent)
        if self.on_sent is not None:
            self.on_sent(sent)
        return self._message(sent)

    async def _editMessageText(self, params: dict) -> dict:
        sent = next(s for s in self.sent if s.message_id == int(params["message_id"]))
        sent.edits.append(params["text"])
        return self._message(sent)

    async def _sendChatAction(self, params: dict) -> bool | web.Response:
        topic = self._topic(params)
        if topic == -1:
            return _error(400, "Bad Request: message thread not found")
        self.actions.append((str(params["chat_id"]), params["action"]))
        self.action_topics.append(topic)
        return True

    def _topic(self, params: dict) -> int | None:
        """The message_thread_id PARAMS send to (None: none; -1: not a topic seen)."""
        if params.get("message_thread_id") in (None, ""):
            return None
        topic = int(params["message_thread_id"])
        return topic if (str(params["chat_id"]), topic) in self.topics else -1

    async def _answerCallbackQuery(self, params: dict) -> bool:
        self.answers.append((params["callback_query_id"], params.get("text", "")))
        return True

    def _message(self, sent: Sent) -> dict:
        message = {"message_id": sent.message_id, "date": sent.date,
                   "chat": {"id": int(sent.chat_id), "type": "private"},
                   "from": {"id": BOT_ID, "is_bot": True, "first_name": "Cortex",
                            "username": BOT_NAME}, "text": sent.text}
        if sent.topic is not None:
            message["chat"] = {"id": int(sent.chat_id), "type": "supergroup",
                               "title": "group", "is_forum": True}
            message.update({"message_thread_id": sent.topic, "is_topic_message": True})
        return message


async def _params(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        return await request.json()
    form = await request.post()
    return {key: form[key] for key in form}


def _flag(value: Any) -> bool:
    """A Boolean parameter, as JSON or as form text."""
    return value is True or str(value).lower() == "true"


def _error(code: int, description: str, parameters: dict | None = None) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=code)
