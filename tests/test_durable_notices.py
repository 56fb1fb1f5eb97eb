"""What ends a turn other than a reply is said only once the turn is durable too.

The error of a rejected reply (`give_up`), the end of a stopped tool loop
(`stopped`), "This channel cannot approve actions" and an approval's outcome were
said first and archived after: a crash in between left the person having seen a
message the archive lacked."""

from __future__ import annotations

import json

import pytest

from conftest import AnsweringApprover, RecordingActuator
from test_durable_reply import CHANNELS, ArchiveWitness, run
from opencortex.config import load_config
from opencortex.events import Thread, chat_message
from opencortex.conversation.delivery import NOT_DELIVERED
from opencortex.llm import EchoBackend, ScriptBackend
from opencortex.actions import reply_action
from opencortex.runtime import build_kernel
from opencortex.turn import TurnResult
from opencortex.verification import Verdict

UNREADABLE = '(:type :REQUEST :text "unterminated'
CLOCK = '(:type :REQUEST :target :tool :action :call :tool "clock")'


def scripted(home, channel: str, chat_id: str, *replies: str, toml: str = "",
             approver=None):
    """A kernel answering with REPLIES, its CHANNEL said by a witness of the archive."""
    if toml:
        (home / "config.toml").write_text(toml)
    path = home / "replies.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    kernel = build_kernel(load_config(home), backend=ScriptBackend(path),
                          writer=lambda text: None)
    witness = ArchiveWitness(channel, kernel)
    witness.chat_id = chat_id
    kernel.actuators.register(witness)
    kernel.approvers.pop(channel, None)
    if approver is not None:
        kernel.approvers[channel] = approver
    return kernel, witness


def said_after_archived(witness: ArchiveWitness, text: str, archived_text: str) -> None:
    """TEXT was said once, when the archive already held ARCHIVED_TEXT."""
    matching = [seen for said, seen in witness.seen if text in said]
    assert len(matching) == 1, witness.seen
    assert archived_text in matching[0], matching[0]


@pytest.mark.parametrize("channel,chat_id", CHANNELS)
def test_the_error_of_a_rejected_reply_is_said_after_its_turn_is_archived(
        home, channel, chat_id):
    kernel, witness = scripted(home, channel, chat_id, *[UNREADABLE] * 2)
    result = run(kernel.handle(chat_message("hello", channel, chat_id)))
    assert result.status == "rejected"
    assert result.text.startswith("System Error:")
    said_after_archived(witness, "System Error:", result.text)


def test_a_stopped_tool_loop_is_said_after_its_turn_is_archived(home):
    kernel, witness = scripted(home, "telegram", "42", CLOCK, CLOCK,
                               toml="[tools]\nmax_steps = 1\n")
    result = run(kernel.handle(chat_message("time?", "telegram", "42")))
    assert result.text.startswith("Stopped:")
    said_after_archived(witness, "Stopped:", result.text)


CROSS_POST = '(:type :REQUEST :target :telegram :chat-id "99" :text "psst")'


def test_a_channel_that_cannot_approve_says_so_after_the_turn_is_archived(home):
    kernel, witness = scripted(home, "emacs", "main")
    event = chat_message("tell 99", "emacs", "main")
    action = reply_action("emacs", "main", "held", kernel.config.chat.buffer)
    result = TurnResult(event.thread, "failed", kernel.backend.name)
    verdict = Verdict("needs-approval", action=action, approval_reason="a skill asks")
    run(kernel.actuation.finish(event, verdict, result))
    assert result.status == "needs-approval"
    said_after_archived(witness, "This channel cannot approve actions", action.printed())
    assert [text for text, _ in witness.seen if text == "held"] == []


@pytest.mark.parametrize("how,shown", [("denied", "Not done (denied)"),
                                       ("approved", "Done: sent to telegram:99")])
def test_an_approval_outcome_is_said_after_its_turn_is_archived(home, how, shown):
    kernel, witness = scripted(home, "emacs", "main", CROSS_POST,
                               approver=AnsweringApprover(how))
    telegram = RecordingActuator("telegram")
    kernel.actuators.register(telegram)
    result = run(kernel.handle(chat_message("tell 99", "emacs", "main")))
    assert result.text.startswith(shown), (result.text, result.errors)
    said_after_archived(witness, shown, f"{how}: a message to telegram:99")
    said_after_archived(witness, shown, result.text if how == "approved" else "tell 99")
    assert (("99", "psst") in telegram.delivered) is (how == "approved")


def test_an_error_the_person_could_not_be_shown_is_marked_undelivered(home):
    kernel, witness = scripted(home, "telegram", "42", *[UNREADABLE] * 2)
    witness.fail = True
    result = run(kernel.handle(chat_message("hello", "telegram", "42")))
    assert any(error.startswith("could not tell the person") for error in result.errors)
    records = kernel.archive.read_thread(Thread("telegram", "42"))
    error, mark = records[-2:]
    assert error.text == result.text and error.role == "system"
    assert mark.extra["CONTROL"] == "delivery" and mark.extra["TARGET"] == error.id
    assert kernel.archive.undelivered([error.id]) == {error.id}


def test_working_memory_knows_what_was_not_delivered(home):
    kernel = build_kernel(load_config(home), backend=EchoBackend(), writer=lambda text: None)
    kernel.conversations.unarchived = frozenset({"telegram"})    # as `archive = false` does
    witness = ArchiveWitness("telegram", kernel, fail=True)
    witness.chat_id = "42"
    kernel.actuators.register(witness)
    thread = Thread("telegram", "42")
    result = run(kernel.handle(chat_message("hello", "telegram", "42")))
    assert result.status == "failed"
    store = kernel.conversations.store_for(thread)
    records = store.thread_records(thread)
    assert store.undelivered([r.id for r in records]) == {result.ids[-1]}
    history = run(kernel.run_command(thread, "/history"))
    assert NOT_DELIVERED.strip() in history
