"""Reply pinning: a reply goes to the conversation it answers, nowhere else (issue 8 §1)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from opencortex.actions import reply_action
from opencortex.config import ChatSettings
from opencortex.events import chat_message
from opencortex.llm import ScriptBackend
from opencortex.pinning import is_own, pin
from opencortex.runtime import build_kernel
from opencortex.verification import Verdict

from conftest import AnsweringApprover, RecordingActuator, cli_env

CHAT = ChatSettings()


class RecordingScript(ScriptBackend):
    """The script backend, keeping every request it was sent."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.requests = []

    async def stream(self, request):
        self.requests.append(request)
        async for item in super().stream(request):
            yield item


def script(tmp_path: Path, *replies: str) -> RecordingScript:
    path = tmp_path / "replies.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    return RecordingScript(path)


def kernel_for(config, backend, *targets):
    frontends = RecordingActuator(*targets)
    printed: list[str] = []
    kernel = build_kernel(config, backend=backend, writer=printed.append)
    kernel.actuators.register(frontends)
    return kernel, frontends, printed


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_guest_reply_to_another_chat_is_refused_and_the_reask_names_the_address(config, tmp_path):
    backend = script(tmp_path,
                     '(:type :REQUEST :target :telegram :chat-id "999" :text "hi")',
                     '(:type :REQUEST :target :telegram :chat-id "42" :text "hello")')
    kernel, frontends, _ = kernel_for(config, backend, "telegram", "emacs")
    result = run(kernel.handle(chat_message("hi", "telegram", "42")))
    assert result.status == "done", result.errors
    assert frontends.delivered == [("42", "hello")]
    retry = backend.requests[1].messages[-1].content
    assert 'telegram:999' in retry and ':chat-id "42"' in retry


def test_guest_turn_cannot_reach_the_owners_emacs_buffer(config, tmp_path):
    insert = ('(:type :REQUEST :target :emacs :action :insert-at-end '
              ':buffer "*opencortex-chat*" :text "* pwned")')
    kernel, frontends, _ = kernel_for(config, script(tmp_path, insert, insert), "telegram", "emacs")
    kernel.approvers["telegram"] = AnsweringApprover("approved")  # a guest is never asked
    result = run(kernel.handle(chat_message("hi", "telegram", "42")))
    assert result.status == "rejected"
    assert all(address == "42" for address, _ in frontends.delivered)
    assert "answers telegram:42" in result.errors[0]
    assert kernel.approvers["telegram"].asked == []


def test_cli_turn_addressing_telegram_is_refused_loudly(config, tmp_path):
    wrong = '(:type :REQUEST :target :telegram :chat-id "999" :text "hi")'
    kernel, frontends, printed = kernel_for(config, script(tmp_path, wrong, wrong), "telegram")
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "rejected"
    assert frontends.delivered == []
    assert printed and "answers cli:local" in printed[0]


@pytest.mark.parametrize("chat_id", ["Main", "main ", " main", "mai\u0301n"])
def test_addresses_compare_exactly(chat_id):
    event = chat_message("hi", "matrix", "main")
    action = reply_action("matrix", chat_id, "x")
    assert not is_own(action, event, CHAT)
    assert is_own(reply_action("matrix", "main", "x"), event, CHAT)


def test_emacs_buffers_only_from_the_emacs_channel():
    allowed = ChatSettings(allowed_buffers=["notes.org"])
    for buffer in ("*opencortex-chat*", "notes.org"):
        action = reply_action("emacs", "main", "x", buffer)
        assert is_own(action, chat_message("hi", "emacs", "main"), allowed)
        assert not is_own(action, chat_message("hi", "cli", "local"), allowed)
    other = reply_action("emacs", "main", "x", "*scratch*")
    assert not is_own(other, chat_message("hi", "emacs", "main"), allowed)


def test_owner_cross_post_asks_with_kernel_facts_and_sends_only_when_approved(config, tmp_path):
    post = '(:type :REQUEST :target :telegram :chat-id "123" :text "line one\\n* fake heading")'
    for how, sent in (("approved", True), ("denied", False), ("timed-out", False)):
        kernel, frontends, _ = kernel_for(config, script(tmp_path, post), "telegram", "emacs")
        approver = kernel.approvers["emacs"] = AnsweringApprover(how)
        result = run(kernel.handle(chat_message("post it", "emacs", "main")))
        request = approver.asked[0]
        assert request.action_class == "cross-post"
        assert request.target == "telegram:123" and request.text.startswith("line one\n")
        assert (("123", "line one\n* fake heading") in frontends.delivered) is sent
        kinds = [r.turn_type for r in kernel.archive.read_thread(result.thread)]
        assert kinds[1] == "yield"
        run(kernel.aclose())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(channel=st.sampled_from(["cli", "emacs", "telegram", "signal", "matrix"]),
       chat_id=st.text(min_size=1, max_size=8).filter(lambda s: s.strip() and "\n" not in s
                                                      and "\r" not in s and "\0" not in s),
       target=st.sampled_from(["cli", "emacs", "telegram", "signal", "matrix"]),
       place=st.text(min_size=1, max_size=8))
def test_without_approval_nothing_leaves_its_conversation(channel, chat_id, target, place):
    event = chat_message("hi", channel, chat_id)
    action = reply_action(target, place, "text", place)
    verdict = pin(Verdict("accepted", action=action), event, CHAT, can_ask=False)
    assert verdict.status == "rejected" or is_own(action, event, CHAT)
    if verdict.status == "accepted" and target not in ("cli", "emacs"):
        assert (target, place) == (channel, chat_id)


def test_read_action_dry_runs_the_rule(home):
    reply = '(:type :REQUEST :target :telegram :chat-id "999" :text "hi")'
    command = [sys.executable, "-m", "opencortex", "read-action", "--channel", "telegram",
               "--json"]
    for chat_id, verdict in (("dry-run", "rejected"), ("999", "accepted")):
        done = subprocess.run([*command, "--chat-id", chat_id], input=reply, text=True,
                              capture_output=True, env=cli_env(home), timeout=60)
        assert json.loads(done.stdout)["verdict"] == verdict, done.stderr
