"""Reply pinning: a reply goes to the conversation it answers, nowhere else.

The kernel applies this rule to every verdict before any actuator runs, whatever
the skills' verifiers said:

- a message action (an Emacs insert, a terminal print, a Telegram, Signal or
  Matrix message) must be addressed to the event's own conversation: the same
  channel and the same chat id or room id, compared exactly (no case folding,
  no trimming);
- Emacs buffers are reachable only from the emacs channel (the chat buffer, or
  a buffer the owner allowed in `[chat] allowed_buffers`); the terminal only
  from the cli channel;
- a message to any other conversation is a cross-post: its own action class,
  which needs the owner's approval on a channel that can ask.  For a guest, or
  where nobody can be asked, it is rejected, and the rejection names the
  address the reply must use, so the re-ask tells the model where to answer.

Tool calls, shell commands, log notes and `:type :RESPONSE` replies carry no
address (a response always goes back where the message came from).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from opencortex.actions import (Action, ChatIdMessage, CliPrint, EmacsInsert, MatrixMessage,
                                reply_action)
from opencortex.events import Event
from opencortex.untrusted import model_note

if TYPE_CHECKING:
    from opencortex.config import ChatSettings
    from opencortex.verification import Verdict

CROSS_POST = "cross-post"


@dataclass(frozen=True)
class Destination:
    """Where a message action goes: a channel and a chat id, room id or buffer."""

    channel: str
    place: str

    def __str__(self) -> str:
        if self.channel == "emacs":
            return f"the Emacs buffer {self.place}"
        if self.channel == "cli":
            return "the terminal"
        return f"{self.channel}:{self.place}"


def destination(action: Action) -> Destination | None:
    """Where ACTION sends text, or None when it is not a message to a conversation."""
    if isinstance(action, EmacsInsert):
        return Destination("emacs", action.buffer)
    if isinstance(action, CliPrint):
        return Destination("cli", "terminal")
    if isinstance(action, ChatIdMessage):
        return Destination(str(action.target), action.chat_id)
    if isinstance(action, MatrixMessage):
        return Destination("matrix", action.room_id)
    return None


def own_buffers(chat: "ChatSettings") -> frozenset[str]:
    """The Emacs buffers a turn on the emacs channel may write to."""
    return frozenset([chat.buffer, *chat.allowed_buffers])


def is_own(action: Action, event: Event, chat: "ChatSettings") -> bool:
    """Whether ACTION stays in EVENT's own conversation (true for non-messages)."""
    where = destination(action)
    if where is None:
        return True
    if where.channel != event.channel:
        return False
    if where.channel == "emacs":
        return where.place in own_buffers(chat)
    if where.channel == "cli":
        return True
    return where.place == event.chat_id


def reply_form(event: Event, chat: "ChatSettings") -> str:
    """The plist a reply to EVENT must use, with a placeholder text."""
    return reply_action(event.channel, event.chat_id, "<your reply>", chat.buffer).printed()


def misaddressed(action: Action, event: Event, chat: "ChatSettings") -> str:
    """The rejection reason for a reply sent somewhere EVENT did not come from."""
    where = destination(action)
    return (f"this reply is addressed to {model_note(str(where), 120)}, but it answers "
            f"{model_note(str(event.thread), 120)}; a reply may only go to the conversation "
            f"it answers. Send it as {reply_form(event, chat)}")


def pin(verdict: "Verdict", event: Event, chat: "ChatSettings", *, can_ask: bool) -> "Verdict":
    """VERDICT with the pinning rule applied.

    A misaddressed message becomes a cross-post that needs approval when
    CAN_ASK (the owner, on a channel that can ask), else a rejection."""
    action = verdict.action
    if verdict.status == "rejected" or action is None or is_own(action, event, chat):
        return verdict
    if can_ask:
        return replace(verdict, status="needs-approval",
                       approval_reason=f"a message to another conversation "
                                       f"({destination(action)}) needs your approval")
    return replace(verdict, status="rejected", errors=[misaddressed(action, event, chat)])
