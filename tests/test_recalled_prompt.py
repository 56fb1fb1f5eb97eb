"""The chat skill shows every recalled memory with its header (where, when, who), however
long the memory: the model needs its date and that it is a memory."""

from __future__ import annotations

import sys
from pathlib import Path

from opencortex.conversation.entries import Entry
from opencortex.skills import SkillRegistry
from opencortex.tools import default_tools

REPO = Path(__file__).resolve().parents[1]
SKILLS = SkillRegistry([REPO / "skills"], default_tools())
SKILLS.load()
SKILL = sys.modules[SKILLS.get("chat").module]


class Context:
    def __init__(self, recalled):
        self.recalled = recalled


def test_a_long_recalled_memory_keeps_its_header_and_its_start():
    header = "[recalled from telegram:-1001, 2025-05-08, user 4711 Ann]"
    body = "I went to the support group yesterday. " + "x" * 3000 + " the end"
    short = f"{header} ok, see you"
    [message] = SKILL.recalled_messages(Context([Entry("r1", "user", f"{header} {body}", 0),
                                                 Entry("r2", "user", short, 0)]), 200)
    first, second = message.content.splitlines()[1:]
    assert first.startswith(f"- {header} I went to the support group yesterday.")
    assert len(first) == len(f"- {header} ") + 200 + len(" …")
    assert second == f"- {short}"
