"""Every form the system prompt shows the model is one the verifier accepts (issue 8 §7).

The chat skill's prompt is built for each channel with the default tools; every
``(:type ...)`` form in it, placeholders filled in, is judged with the real
skills and pinned to the conversation as a turn would be.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from opencortex.config import ChatSettings
from opencortex.conversation.entries import Entry
from opencortex.events import CHANNELS, chat_message
from opencortex.pinning import pin
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.tools import default_tools
from opencortex.verification import judge

REPO = Path(__file__).resolve().parents[1]
CHAT_IDS = {"emacs": "local", "cli": "local", "telegram": "42", "signal": "+100",
            "matrix": "!room:example.org"}
PLACEHOLDERS = {"<Response>": "Hello there", "<Heading>": "Greeting",
                "<string>": '"Oslo"', "<integer>": "3", "<number>": "1.5",
                "<t-or-nil>": "t", "<list>": "()", "<plist>": "(:a 1)"}
GENERIC_ARGS = "(:<arg> <value> ...)"  # the tool-call template's argument list

TOOLS = default_tools()
SKILLS = SkillRegistry([REPO / "skills"], TOOLS)   # the bundled deftools join TOOLS
SKILLS.load()
assert not SKILLS.errors, SKILLS.errors


def shown_forms(prompt: str) -> list[str]:
    """Every complete ``(:type ...)`` form in PROMPT (one line each; a mention
    such as "starting with (:type :REQUEST." that never closes is not a form)."""
    forms = []
    for start in (m.start() for m in re.finditer(r"\(:type\b", prompt)):
        end = _form_end(prompt, start)
        if end is not None:
            forms.append(prompt[start:end])
    return forms


def _form_end(text: str, start: int) -> int | None:
    """The end of the balanced form at START on its line, or None."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "\n":
            return None
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def filled(form: str) -> list[str]:
    """FORM with its placeholders filled; the tool-call template once per tool."""
    if "<name>" not in form:
        return [_fill(form)]
    calls = []
    for name in TOOLS.descriptions():
        tool = TOOLS.get(name)
        assert tool is not None
        arguments = tool.signature().partition(":args ")[2][:-1] or "()"
        calls.append(_fill(form.replace("<name>", name).replace(GENERIC_ARGS, arguments)))
    return calls


def _fill(form: str) -> str:
    """FORM with every <placeholder> (optional ones too) replaced by a value."""
    form = re.sub(r"<([^<>]+), optional>", r"<\1>", form)
    form = re.sub(r'<one of ("[^"]*")[^<>]*>', r"\1", form)   # a choice: its first value
    for placeholder, value in PLACEHOLDERS.items():
        form = form.replace(placeholder, value)
    assert "<" not in form.replace("<=", ""), f"unfilled placeholder in {form}"
    return form


def system_prompt(channel: str) -> tuple[str, SkillContext]:
    """The chat skill's system prompt for a message on CHANNEL, and its context."""
    chat = ChatSettings()
    ctx = SkillContext(event=chat_message("hi", channel, CHAT_IDS[channel]),
                       config={"buffer": chat.buffer, "allowed-buffers": [],
                               "history-chars": chat.history_chars},
                       tools=TOOLS.descriptions())
    skill = SKILLS.get("chat")
    assert skill is not None and skill.probabilistic is not None
    return skill.probabilistic(ctx)["system"], ctx


@pytest.mark.parametrize("channel", CHANNELS)
def test_every_form_the_prompt_shows_is_accepted(channel):
    prompt, ctx = system_prompt(channel)
    forms = [text for form in shown_forms(prompt) for text in filled(form)]
    assert len(forms) >= 2, prompt  # the reply format and a tool call at least
    for text in forms:
        verdict = pin(judge(text, SKILLS.skills, ctx, TOOLS), ctx.event, ChatSettings(),
                      can_ask=False)
        assert verdict.status == "accepted", (text, verdict.errors)


def test_tool_signatures_are_exact_forms():
    clock = TOOLS.get("clock")
    assert clock is not None
    assert clock.signature() == '(:type :REQUEST :target :tool :action :call :tool "clock")'
    assert ":args" not in TOOLS.descriptions()["clock"]



def test_history_is_cleaned_and_trimmed_alike_every_turn():
    """Noise is purged and each text trimmed to its last history-chars characters, short
    texts (whose result the skill remembers) and long ones alike, turn after turn."""
    _, ctx = system_prompt("cli")
    ctx = replace(ctx, history=[
        Entry(id="q", role="user", text="Thinking...what is it? System Error: boom", turn=1),
        Entry(id="a", role="assistant", text="x" * 5000 + " the end", turn=1)])
    skill = SKILLS.get("chat")
    assert skill is not None and skill.probabilistic is not None
    first, again = (skill.probabilistic(ctx)["messages"] for _ in range(2))
    assert first == again
    question, answer, _ = (message.content for message in first)
    assert question == "what is it?"
    assert len(answer) == ChatSettings().history_chars and answer.endswith("x the end")
