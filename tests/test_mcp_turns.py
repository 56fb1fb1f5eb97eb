"""MCP tools inside turns (issue 12): the kernel starts the configured servers, their
tools are called like any tool, and the approval policy rules on them by trust and
annotations — a deny in config always wins, an untrusted server always asks."""

from __future__ import annotations

import sys

from conftest import AnsweringApprover
from opencortex.events import chat_message
from test_mcp import SERVER
from test_tool_loop import kernel_with, run, say


def call(tool: str, args: str) -> str:
    return f'(:type :REQUEST :target :tool :action :call :tool "{tool}" :args {args})'


def config(trust: str, extra: str = "") -> str:
    return (f'[mcp.servers.notes]\ncommand = ["{sys.executable}", "{SERVER}"]\n'
            f'trust = "{trust}"\ntimeout = 10\n{extra}')


def turn(home, toml: str, *replies: str, approver=None):
    kernel, backend, printed, _ = kernel_with(home, *replies, toml=toml, approver=approver)

    async def scenario():
        try:
            await kernel.start()
            return await kernel.handle(chat_message("go"))
        finally:
            await kernel.aclose()
    return run(scenario()), backend, printed


LOOKUP = call("notes/lookup", '(:query "tables" :max-results 2)')
DELETE = call("notes/delete_note", '(:note-id "n1")')


def test_a_trusted_read_only_tool_runs_without_asking(home):
    approver = AnsweringApprover("denied")
    result, backend, _ = turn(home, config("trusted"), LOOKUP, say("found"), approver=approver)
    assert result.text == "found" and approver.asked == []
    assert result.steps[0].outcome == "done"
    assert "found tables (2 at most)" in backend.requests[1].messages[-1].content


def test_a_destructive_tool_asks_and_a_denial_reaches_the_model(home):
    approver = AnsweringApprover("denied")
    result, backend, _ = turn(home, config("trusted"), DELETE, say("kept"), approver=approver)
    assert approver.asked[0].tool == "notes/delete_note"
    assert approver.asked[0].arguments == '(:note_id "n1")'
    assert result.steps[0].outcome == "not approved"
    assert "denied by the owner" in backend.requests[1].messages[-1].content


def test_an_untrusted_server_always_asks(home):
    approver = AnsweringApprover("approved")
    result, _, _ = turn(home, config("untrusted", '[approvals]\ntools = { "notes/*" = "allow" }\n'),
                        LOOKUP, say("ok"), approver=approver)
    assert len(approver.asked) == 1 and result.steps[0].outcome == "done"


def test_a_deny_in_config_beats_a_read_only_annotation(home):
    approver = AnsweringApprover("approved")
    result, _, _ = turn(home, config("trusted", '[approvals]\ntools = { "notes/lookup" = "deny" }\n'),
                        LOOKUP, say("no"), approver=approver)
    assert approver.asked == [] and result.steps[0].outcome == "denied"


def test_arguments_are_checked_against_the_schema_before_anything_is_asked(home):
    approver = AnsweringApprover("approved")
    bad = call("notes/delete_note", '(:note-id 5 :force t)')
    result, _, _ = turn(home, config("trusted"), bad, say("sorry"), approver=approver)
    assert approver.asked == [] and result.steps == []
    assert result.attempts == 2 and result.text == "sorry"
