"""`deftool` (issue 12): tools written in Hy, typed by their annotations, loaded and
reloaded with the skills, broken ones reported as file:line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opencortex.events import chat_message
from opencortex.skills import SkillRegistry
from opencortex.tools import default_tools
from opencortex.tools.context import ToolContext
from opencortex.tools.settings import ToolSettings

GOOD = '''
(deftool word-count [ctx #^ str text #^ bool [unique False]]
  "Count the words of a text."
  :risk :read-only
  (setv words (.split text))
  (str (len (if unique (set words) words))))

(deftool shout [ctx #^ str text]
  "Upper-case a text."
  :risk :writes
  :preview (fn [ctx text] (+ "would shout " text))
  :needs-approval (fn [ctx text] (when (> (len text) 3) "long texts are asked about"))
  (await (asyncio.sleep 0))
  (.upper text))
'''


def load(directory: Path):
    tools = default_tools()
    registry = SkillRegistry([directory], tools)
    registry.load()
    return registry, tools


def call(tool, **args):
    ctx = ToolContext(event=chat_message("x"), settings=ToolSettings())
    return asyncio.run(tool.run(tool.arguments.model_validate(args), ctx))


def test_a_tool_is_typed_by_its_annotations_and_runs(tmp_path):
    (tmp_path / "tools.hy").write_text("(import asyncio)\n" + GOOD)
    registry, tools = load(tmp_path)
    assert registry.errors == []
    count = tools.get("word-count")
    assert count.risk == "read-only" and count.line == 3
    assert count.source == tmp_path / "tools.hy"
    assert count.signature().endswith(':args (:text <string> :unique <t-or-nil, optional>))')
    assert call(count, text="a b a", unique=True) == "2"
    assert tools.validate_call("word-count", {"text": "a"}) == {"text": "a", "unique": False}
    for bad in ({"text": 3}, {}, {"text": "a", "extra": 1}):
        with pytest.raises(ValueError):
            tools.validate_call("word-count", bad)
    shout = tools.get("shout")
    assert shout.risk == "writes" and call(shout, text="hey") == "HEY"
    ctx = ToolContext(event=chat_message("x"), settings=ToolSettings())
    args = shout.arguments.model_validate({"text": "hello"})
    assert shout.preview(args, ctx) == "would shout hello"
    assert shout.needs_approval(args, ctx) == "long texts are asked about"


@pytest.mark.parametrize("source, line, message", [
    ("\n\n(deftool bad [ctx x] \"Doc.\" 1)", 3, "argument x needs a type"),
    ("(deftool bad [ctx #^ str x] 1)", 1, "write a docstring"),
    ("(deftool bad [ctx] \"Doc.\" :risk :dangerous 1)", 1, ":risk must be one of"),
    ("(deftool bad [ctx] \"Doc.\" :colour 1 1)", 1, "unknown option :colour"),
    ("(deftool bad [] \"Doc.\" 1)", 1, "the first parameter receives the tool context"),
])
def test_a_broken_tool_is_reported_as_file_and_line(tmp_path, source, line, message):
    (tmp_path / "broken.hy").write_text(source)
    (tmp_path / "fine.hy").write_text('(deftool fine [ctx] "Fine." "ok")')
    registry, tools = load(tmp_path)
    [error] = registry.errors
    assert (error.path, error.line) == (tmp_path / "broken.hy", line)
    assert message in error.message
    assert tools.get("fine") is not None and tools.get("bad") is None


def test_tools_reload_with_the_skills_and_names_are_unique(tmp_path):
    note = tmp_path / "t.org"
    note.write_text('* T\n#+begin_src hy\n(deftool greet [ctx] "Hi." "hi")\n#+end_src\n')
    registry, tools = load(tmp_path)
    assert call(tools.get("greet")) == "hi"
    note.write_text('* T\n#+begin_src hy\n(deftool greet [ctx] "Hi." "hello")\n'
                    '(deftool clock [ctx] "Mine." "no")\n#+end_src\n')
    registry.reload()
    assert call(tools.get("greet")) == "hello"
    [error] = registry.errors
    assert error.line == 4 and "already defined by kernel" in error.message
    note.unlink()
    registry.reload()
    assert tools.get("greet") is None and tools.get("clock") is not None
