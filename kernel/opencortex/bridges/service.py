"""One bridge at work: platform messages in, the kernel's turns, replies out.

`Bridge.run` fetches from its `Platform`, keeps each message in the durable
`Inbox` before acknowledging it, and hands it to a worker per conversation (a
chat, or a topic of one: turns of one in order, conversations in parallel).
For each message, in order:

1. the `Gate` decides (strangers, groups, flood) as it arrives, before anything
   else sees it; what it does not let in is done at once (its text leaves the
   inbox), and a stranger's refusal is best effort: queued (at most
   `REFUSAL_BACKLOG`, the rest dropped) and sent only when the platform's global
   budget is free, so replies to allowed chats always go first;
2. a reply "approve"/"deny" to an open approval of the sender settles it;
3. media without a caption gets "text only"; edits and deletions are ignored;
4. `/start` (and `/cmd@bot` in groups) become the kernel's commands;
5. a message the inbox hands out again after a crash whose platform id is already in
   the archive (its turn ended just before the crash) makes no second turn: the reply
   archived with it is said again (a reply is said only after its turn is durable,
   so a crash in between left it unsaid; one just after saying it says it twice);
6. otherwise it becomes a chat event for the kernel's normal turn, with the
   typing indicator kept alive; the reply comes back through `BridgeActuator`,
   pinned to this chat by the kernel.

The message is marked done in the inbox once its turn ended (archived, or
failed with the person told why).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import deque
from typing import Any

from opencortex.actuation import PLATFORM_ID
from opencortex.actuators import ActuatorError
from opencortex.bridges.access import Gate, flood_notice
from opencortex.bridges.actuator import BridgeActuator
from opencortex.bridges.approvals import BridgeApprover, parse_answer
from opencortex.bridges.contract import BridgeError, Decision, Platform
from opencortex.bridges.inbound import Inbound
from opencortex.bridges.inbox import Inbox
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.settings import BridgeSettings
from opencortex.conversation.commands import OWNERS_ONLY, USAGE
from opencortex.error_place import unexpected
from opencortex.events import EventError, Thread, chat_message, chat_of, platform_time
from opencortex.kernel import Kernel

log = logging.getLogger(__name__)

FRONTEND_ONLY = ("quit",)   # commands that mean nothing in a chat app
UNARCHIVED = ("This chat is not archived: the kernel keeps it in working memory only, "
              "and forgets it when it restarts.")
TEXT_ONLY = "I can read text only; send your message as text (a caption works too)."
TYPING_AFTER = 0.5      # seconds a turn runs before the typing indicator is shown
TYPING_EVERY = 4.0      # seconds; platforms drop the indicator after about 5
BACKOFF_MAX = 60.0      # seconds between attempts to reach a failing platform
STOP_GRACE = 10.0       # seconds turns in flight may take to finish on stop
REFUSAL_BACKLOG = 100   # refusals waiting for a free slot; more are dropped


def command_menu() -> list[tuple[str, str]]:
    """The kernel's slash commands as (name, description) for a platform's menu (one
    menu for everyone: the commands only owners may run are left out)."""
    return [(name, usage.partition("—")[2].strip() or name) for name, usage in USAGE.items()
            if name not in FRONTEND_ONLY and name not in OWNERS_ONLY]


class Bridge:
    """Runs one platform against the kernel until stopped."""

    def __init__(self, platform: Platform, settings: BridgeSettings, kernel: Kernel,
                 inbox: Inbox, approval_timeout: float):
        self.platform = platform
        self.settings = settings
        self.kernel = kernel
        self.inbox = inbox
        self.gate = Gate(settings)
        self.actuator = BridgeActuator(platform)
        self.approver = BridgeApprover(platform, settings.approvers,
                                       settings.approval_timeout or approval_timeout)
        self.status: dict[str, Any] = {"state": "starting", "errors": 0, "last_error": ""}
        self._chats: dict[str, asyncio.Queue[tuple[Inbound, str]]] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._replayed: set[int] = set()   # pending at start: maybe archived before a crash
        self._refusals: deque[str] = deque()   # chats owed a refusal, sent when free
        self._refuser: asyncio.Task[None] | None = None
        self.bot_name = ""
        kernel.actuators.register(self.actuator)
        kernel.approvers[platform.channel] = self.approver
        kernel.reporters[f"{platform.channel} bridge"] = self.report

    @property
    def channel(self) -> str:
        return self.platform.channel

    def report(self) -> str:
        """One line for /metrics: state, failures, strangers and drops (counts only)."""
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.gate.counts.items())) or "no traffic"
        line = f"{self.status['state']}; {self.status['errors']} failures; {counts}"
        if self.status["last_error"]:
            line += f"; last error: {self.status['last_error']}"
        return line

    # -- the loop -------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and dispatch until STOP is set; failures are retried with backoff."""
        delay = 1.0
        while not stop.is_set():
            try:
                if not self.bot_name:
                    self.bot_name = await self.platform.start()
                    await self.platform.register_commands(command_menu())
                    log.info("%s bridge connected", self.channel)
                    for message in self.inbox.pending():
                        self._replayed.add(message.position)
                        self._admit(message)
                await self._fetch_once(stop)
                self.status["state"], delay = "running", 1.0
            except Exception as error:   # the platform failed (BridgeError), or a defect
                self._report(error)      # or an error it did not wrap: retried alike
                wait = BACKOFF_MAX if isinstance(error, BridgeError) and error.fatal else delay
                delay = min(BACKOFF_MAX, delay * 2)
                await self._sleep(stop, wait * random.uniform(0.8, 1.2))
        await self._drain()

    async def _fetch_once(self, stop: asyncio.Event) -> None:
        fetch = asyncio.ensure_future(self.platform.fetch())
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if fetch not in done:
            fetch.cancel()
            return
        items = fetch.result()
        fresh = await self.inbox.keep([self._stripped(item) for item in items
                                       if isinstance(item, Inbound)])
        await self.platform.acknowledge()
        for message in fresh:
            self._admit(message)
        for item in items:
            if isinstance(item, Decision):
                await self._decision(item)

    def _stripped(self, message: Inbound) -> Inbound:
        """MESSAGE as the inbox may keep it: a stranger's without its text or name (it is
        only refused or ignored, and their content is never kept)."""
        if self.gate.may_speak(message):
            return message
        return dataclasses.replace(message, text="", sender_name="")

    def _report(self, error: Exception) -> None:
        """Count ERROR and say it in the status and the log: a BridgeError by its text
        (the platform's words), any other by its type and where it was raised (its
        text may quote what was received)."""
        if isinstance(error, BridgeError):
            said = str(error)
        else:
            said = unexpected(error)
        self.status.update(state="retrying", last_error=said)
        self.status["errors"] += 1
        log.warning("%s bridge: %s; retrying", self.channel, said)

    @staticmethod
    async def _sleep(stop: asyncio.Event, seconds: float) -> None:
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _drain(self) -> None:
        """Let turns in flight finish (bounded), then release the platform."""
        if self._refuser is not None:
            self._refuser.cancel()
        if self._workers:
            _, late = await asyncio.wait(self._workers, timeout=STOP_GRACE)
            for task in late:
                task.cancel()
        await self.platform.stop()
        self.inbox.close()

    def _admit(self, message: Inbound) -> None:
        """Gate MESSAGE as it arrives: settle an approval it answers, queue it for its
        chat, or drop it at once (done: nothing of it stays), owing a stranger a refusal."""
        decision = self.gate.decide(message).decision
        if decision == "allow" and self._settles_approval(message):
            self.inbox.done(message.position)
        elif decision in ("allow", "flood-notice"):
            self._dispatch(message, decision)
        else:
            self.inbox.done(message.position)
            self._replayed.discard(message.position)
            if decision == "refuse":
                self._refuse(message.conversation)

    def _refuse(self, chat_id: str) -> None:
        """Owe CHAT_ID a refusal, unless REFUSAL_BACKLOG are owed already (then dropped)."""
        if len(self._refusals) >= REFUSAL_BACKLOG:
            self.gate.counts["refusal-dropped"] += 1
            return
        self._refusals.append(chat_id)
        if self._refuser is None or self._refuser.done():
            self._refuser = asyncio.create_task(self._send_refusals())

    async def _send_refusals(self) -> None:
        """Send the refusals owed, each only when the pacer has a free slot at once (low
        priority: a reply waiting goes first), the oldest of a chat that is free first
        (one waiting for its chat's slot holds up no other chat's); one attempt each, a
        failure drops it."""
        pacer = self.actuator.pacer
        while self._refusals:
            chat_id = next((chat for chat in self._refusals if pacer.try_now(chat_of(chat))),
                           None)
            if chat_id is None:
                await asyncio.sleep(pacer.interval)
                continue
            self._refusals.remove(chat_id)
            try:
                await self.platform.send(chat_id, "", self.settings.refusal_text)
            except Exception as error:   # best effort: a refusal never stops the others
                log.info("%s bridge: a refusal was not sent: %s", self.channel,
                         type(error).__name__)

    def _settles_approval(self, message: Inbound) -> bool:
        """Settle an open approval when MESSAGE (let in by the gate) answers it
        ("approve", "deny", …).

        Decided here, as it arrives: queued behind the turn that waits for this very
        answer, it would only be read after the approval expired."""
        answer = parse_answer(message.text) if message.kind == "text" else None
        approval = self.approver.open_in(message.conversation, message.sender_id) \
            if answer is not None else None
        if approval is None:
            return False
        said = self.approver.decide(approval, self.approver.digest_of(approval),
                                    message.sender_id, bool(answer))
        task = asyncio.create_task(self._say(message, said))
        self._workers.add(task)
        task.add_done_callback(self._workers.discard)
        return True

    # -- per chat -------------------------------------------------------------

    def _dispatch(self, message: Inbound, decision: str) -> None:
        """Queue MESSAGE (and the gate's DECISION) behind earlier ones of its chat; start
        the chat's worker if idle."""
        queue = self._chats.get(message.conversation)
        if queue is None:
            queue = self._chats[message.conversation] = asyncio.Queue()
            task = asyncio.create_task(self._work(message.conversation, queue))
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)
        queue.put_nowait((message, decision))

    async def _work(self, chat_id: str, queue: asyncio.Queue[tuple[Inbound, str]]) -> None:
        try:
            while not queue.empty():
                message, decision = queue.get_nowait()
                try:
                    await self._handle(message, decision)
                except Exception as error:   # one message must not stop its chat
                    log.error("%s bridge: a message failed: %s", self.channel,
                              type(error).__name__)
                self.inbox.done(message.position)
                self._replayed.discard(message.position)
        finally:
            self._chats.pop(chat_id, None)

    async def _handle(self, message: Inbound, decision: str) -> None:
        """MESSAGE of a chat, its turn come: the flood notice, or the turn itself."""
        if decision == "flood-notice":
            await self._say(message, flood_notice(self.settings))
            return
        if message.kind in ("edit", "deletion", "other"):
            log.info("%s bridge: %s of an earlier message ignored", self.channel, message.kind)
            return
        if not message.text.strip():
            await self._say(message, TEXT_ONLY)
            return
        await self._turn(message)

    async def _turn(self, message: Inbound) -> None:
        try:
            event = chat_message(self._command_text(message.text), self.channel,
                                 message.conversation, message.sender_id, message.sender_name)
        except EventError:
            await self._say(message, "I could not read that message; send it again.")
            return
        event = event.model_copy(update={"message_id": message.message_id,
                                         "sent_at": platform_time(message.sent_at)})
        if message.position in self._replayed:
            answer = await self._archived_answer(event.thread, message.message_id)
            if answer is not None:
                log.info("%s bridge: a redelivered message's turn was archived; its reply "
                         "is said again", self.channel)
                reply_id, reply = answer        # its id: said once where the platform can
                if reply:
                    await self._say(message, reply, key=reply_id)
                return
        typing = asyncio.create_task(self._keep_typing(message.conversation))
        try:
            await self.kernel.handle(event)
        finally:
            typing.cancel()
        if event.text.split()[0] == "/help" and not self.settings.archive:
            await self._say(message, UNARCHIVED)

    def _command_text(self, text: str) -> str:
        """`/start` means /help; `/cmd@thisbot args` means `/cmd args`."""
        words = text.strip().split(maxsplit=1)
        if not words or not words[0].startswith("/"):
            return text
        command, _, bot = words[0].partition("@")
        if bot and self.bot_name and bot.lower() != self.bot_name.lower():
            return text
        command = "/help" if command.lower() == "/start" else command
        return " ".join([command, *words[1:]])

    async def _archived_answer(self, thread: Thread, message_id: str
                               ) -> tuple[str, str] | None:
        """For a redelivery after a crash: None when THREAD's archive lacks the message
        MESSAGE_ID, else the id and text of the reply archived after it in its turn
        (both "" when none)."""
        store = self.kernel.conversations.store_for(thread)
        records = await asyncio.to_thread(store.history, thread, 50)
        asked = next((n for n, r in enumerate(records) if r.role == "user"
                      and r.extra.get(PLATFORM_ID) == message_id), None)
        if asked is None:
            return None
        turn = []
        for record in records[asked + 1:]:
            if record.role == "user":
                break
            turn.append(record)
        return next(((r.id, r.text) for r in reversed(turn) if r.role == "assistant" and
                     r.turn_type == "speech"), ("", ""))

    async def _keep_typing(self, chat_id: str) -> None:
        """Show "typing…" while the turn runs: from TYPING_AFTER seconds on (a quick
        answer needs none), renewed before the platform drops it."""
        await asyncio.sleep(TYPING_AFTER)
        while True:
            try:
                await self.platform.typing(chat_id)
            except (BridgeError, RetryAfter):
                pass
            await asyncio.sleep(TYPING_EVERY)

    async def _decision(self, decision: Decision) -> None:
        said = self.approver.decide(decision.approval_id, decision.digest, decision.sender_id,
                                    decision.approve)
        try:
            await self.platform.answer_decision(decision, said)
        except (BridgeError, RetryAfter) as error:
            log.info("%s bridge: a decision was not acknowledged: %s", self.channel, error)

    async def _say(self, message: Inbound, text: str, key: str | None = None) -> None:
        """A short notice from the bridge itself, or a reply said again (KEY: its id, see
        `Platform.send`), as the answer to MESSAGE in its conversation; never raises."""
        try:
            await self.actuator.deliver(message.conversation, text, key,
                                        reply_to=message.message_id or None)
        except ActuatorError as error:
            log.info("%s bridge: a notice was not sent: %s", self.channel, error)
