"""Working memory (`archive = false` channels): what it keeps and what it knows was never
delivered, the same as the archive would say."""

from opencortex.events import Thread
from opencortex.memory import NewMessage
from opencortex.memory.working import WorkingMemory

CHAT = Thread("telegram", "42")
OTHER = Thread("telegram", "7")


def said(text, thread=CHAT, role="assistant", **extra):
    return NewMessage(role=role, text=text, thread=thread, extra=extra)


def mark(target, thread=CHAT):
    return NewMessage(role="system", text="Not delivered: gone", thread=thread,
                      turn_type="silence", parent=None,
                      extra={"CONTROL": "delivery", "TARGET": target, "DELIVERY": "failed"})


def test_a_reply_followed_by_its_mark_is_undelivered():
    memory = WorkingMemory()
    question, reply = memory.append([said("hi", role="user"), said("hello")])
    other, = memory.append([said("elsewhere", thread=OTHER)])
    memory.append([mark(reply.id)])
    assert memory.undelivered([question.id, reply.id, other.id]) == {reply.id}


def test_a_message_carrying_the_failure_itself_is_undelivered():
    memory = WorkingMemory()
    reply, = memory.append([said("nobody could take this", DELIVERY="failed")])
    assert memory.undelivered([reply.id]) == {reply.id}


def test_a_mark_that_does_not_follow_its_message_marks_nothing():
    memory = WorkingMemory()
    first, second = memory.append([said("one"), said("two")])
    control, = memory.append([mark(first.id)])            # follows `second`, not `first`
    assert memory.undelivered([first.id, second.id, control.id]) == set()


def test_a_forgotten_message_is_no_longer_named():
    memory = WorkingMemory(limit=3)
    reply, = memory.append([said("hello")])
    memory.append([mark(reply.id)])
    assert memory.undelivered([reply.id]) == {reply.id}
    memory.append([said("more"), said("and more")])        # `reply` is forgotten
    assert memory.thread_records(CHAT)[0].id != reply.id
    assert memory.undelivered([reply.id]) == set()
