"""Replies the person never got: the mark the archive keeps, and how they are shown.

A reply is said only once its turn is durable (`Actuation.reply`).  When the
platform then refuses it (a bridge's send fails, Emacs is gone), the turn stays
in the archive as written (org files are append-only: an entry is never
rewritten), and a control record follows it at once in the same file, written
while the thread's turn lock is still held::

    * system [2026-11-28 Sat 07:02]
    :PROPERTIES:
    :CONTROL:  delivery
    :TARGET:   <the reply's id>
    :BRANCH:   main
    :DELIVERY: failed
    ...
    Not delivered: <what the platform said>

A reply no actuator could take was known undelivered before its write and
carries `:DELIVERY: failed` itself.  Either way the store's `undelivered` names
it, and everything that shows it later says so: the model's context (live, and
rebuilt after a restart), `/history` and recall give its text behind
NOT_DELIVERED.  The reply stays in the context (it is what the model answered,
and the next turn follows it), but the model is told the person did not see
it, so it does not build on it as read; it may say it again.  The mark is a
control record: search, recall, views and prompts never show it.
"""

from __future__ import annotations

from opencortex.conversation.branches import BRANCH, CONTROL, TARGET
from opencortex.events import Thread
from opencortex.memory import NewMessage
from opencortex.memory.rows import DELIVERY, FAILED

KIND = "delivery"            # the CONTROL kind of the mark
NOT_DELIVERED = "[not delivered: the person never saw this] "
MAX_WHY = 300                # characters of the platform's reason kept in the mark

__all__ = ["DELIVERY", "FAILED", "KIND", "NOT_DELIVERED", "as_seen", "delivery_mark"]


def delivery_mark(thread: Thread, target: str, branch: str, why: str) -> NewMessage:
    """The control record saying that TARGET, archived, never reached the person (WHY:
    what the platform said)."""
    reason = " ".join(why.split())[:MAX_WHY] or "the platform refused it"
    return NewMessage(role="system", text=f"Not delivered: {reason}", thread=thread,
                      turn_type="silence", parent=None,
                      extra={CONTROL: KIND, TARGET: target, BRANCH: branch, DELIVERY: FAILED})


def as_seen(text: str, undelivered: bool) -> str:
    """TEXT as the model and a person reading the history are shown it: marked when
    the person never got it."""
    return NOT_DELIVERED + text if undelivered else text
