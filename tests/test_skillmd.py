"""SKILL.md skills (issue 12): parsing, checks with file:line, the catalogue in the
chat prompt, the skill-load tool, reload, and allowed-tools narrowing."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from opencortex.config import ChatSettings
from opencortex.events import chat_message
from opencortex.pinning import pin
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.skills.skillmd import (
    MAX_FILE_BYTES, SkillWarning, allowed_entries, load_docs, narrowed)
from opencortex.verification import judge

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "skillmd"
GOOD = """\
---
name: {name}
description: Says what {name} does.
---
Do the {name} thing.
"""


def skill(root: Path, folder: str, text: str) -> Path:
    """Write TEXT (dedented) as ROOT/FOLDER/SKILL.md; return the SKILL.md path."""
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def only_error(root: Path) -> tuple[str, int | None, str]:
    """The one error loading ROOT gives, as (file name, line, message); no skill loads."""
    docs = load_docs([root])
    assert len(docs) == 0
    assert len(docs.errors) == 1, docs.errors
    error = docs.errors[0]
    return error.path.name, error.line, error.message


def context(registry: SkillRegistry | None = None, **fields) -> SkillContext:
    chat = ChatSettings()
    return SkillContext(event=chat_message("hi", "cli", "local"),
                        config={"buffer": chat.buffer, "allowed-buffers": [],
                                "history-chars": chat.history_chars},
                        tools=registry.tool_registry.descriptions() if registry else {},
                        **fields)


@pytest.fixture
def chat_dir(tmp_path) -> Path:
    """A skill directory holding only the bundled chat skill (others may be mid-edit)."""
    directory = tmp_path / "hy"
    directory.mkdir()
    shutil.copy(REPO / "skills" / "chat.org", directory)
    return directory


def loaded(*directories: Path) -> SkillRegistry:
    registry = SkillRegistry(list(directories))
    assert registry.load() == []
    return registry


# -- parsing -------------------------------------------------------------------

def test_the_fixture_skill_parses_whole():
    docs = load_docs([FIXTURE])
    assert docs.errors == []
    doc = docs.get("release-notes")
    assert doc is not None and doc.folder == FIXTURE / "release-notes"
    assert docs.catalogue() == {"release-notes": doc.description}
    assert doc.description.startswith("Drafts release notes") and "\n" not in doc.description
    assert doc.license == "GPL-3.0-or-later"
    assert doc.metadata == {"author": "opencortex", "version": "1.0"}
    assert docs.allowed_tools("release-notes") == frozenset({"clock", "files-read"})
    assert doc.files == ("references/style.md", "scripts/changes.sh")
    assert doc.body.startswith("# Release notes")


def test_optional_keys_may_be_left_out_and_unknown_keys_are_ignored(tmp_path):
    skill(tmp_path, "tiny", "---\nname: tiny\ndescription: x\nuser-invocable: true\n---\n")
    docs = load_docs([tmp_path])
    assert docs.errors == [] and docs.allowed_tools("tiny") is None
    assert docs.get("tiny").body == "" and docs.get("tiny").metadata == {}


def test_metadata_numbers_read_as_text_and_nested_values_are_refused(tmp_path):
    skill(tmp_path, "meta", "---\nname: meta\ndescription: x\nmetadata:\n  version: 1.5\n"
                            "  beta: true\n---\n")
    assert load_docs([tmp_path]).get("meta").metadata == {"version": "1.5", "beta": "true"}
    skill(tmp_path, "meta", "---\nname: meta\ndescription: x\nmetadata:\n  deep: [1, 2]\n---\n")
    name, line, message = only_error(tmp_path)
    assert (name, line) == ("SKILL.md", 4) and "metadata.deep" in message


def test_name_must_match_the_folder(tmp_path):
    skill(tmp_path, "notes", "---\ndescription: Writes notes.\nname: release-notes\n---\n")
    name, line, message = only_error(tmp_path)
    assert (name, line) == ("SKILL.md", 3)
    assert "'release-notes' must equal the folder name 'notes'" in message


@pytest.mark.parametrize("bad", ["Release", "-notes", "notes-", "re--lease", "a" * 65, "ré"])
def test_names_follow_the_spec(tmp_path, bad):
    skill(tmp_path, "x", f"---\nname: {bad}\ndescription: x\n---\n")
    _, line, message = only_error(tmp_path)
    assert line == 2 and "lowercase letters, digits and single hyphens" in message


def test_bad_yaml_names_the_line(tmp_path):
    path = skill(tmp_path, "broken", "---\nname: broken\ndescription: [unclosed\nlicense: MIT\n---\n")
    docs = load_docs([tmp_path])
    assert len(docs.errors) == 1
    error = docs.errors[0]
    assert error.path == path.absolute()
    assert str(error) == (f"{path.absolute()}:3: bad YAML: while parsing a flow sequence: "
                          "expected ',' or ']', but got ':' (line 4)")
    path.write_text("---\nname: broken\ndescription: ok\n  bad: indent\n---\n")
    assert only_error(tmp_path)[1:] == (4, "bad YAML: mapping values are not allowed here")


def test_missing_description_is_reported_at_line_1(tmp_path):
    skill(tmp_path, "nodesc", "---\nname: nodesc\n---\nbody\n")
    assert only_error(tmp_path) == (
        "SKILL.md", 1, "missing required key `description`; add `description: ...` "
        "to the front matter")


def test_too_long_or_blank_description_names_its_line(tmp_path):
    skill(tmp_path, "long", "---\nname: long\nlicense: MIT\ndescription: " + "x" * 1025 + "\n---\n")
    _, line, message = only_error(tmp_path)
    assert line == 4 and "1024" in message
    skill(tmp_path, "long", "---\nname: long\ndescription: '  '\n---\n")
    assert only_error(tmp_path)[1:] == (3, "description: must not be empty")


@pytest.mark.parametrize("text, needle", [
    ("# Just markdown\n", "must start with a `---` line"),
    ("---\nname: open\ndescription: never closed\n", "not closed"),
    ("---\n" + "k: v\n" * 5000 + "---\n", "runs past"),
    ("---\n- a list\n---\n", "must be a YAML mapping"),
])
def test_missing_unclosed_or_odd_front_matter_is_reported_at_the_top(tmp_path, text, needle):
    skill(tmp_path, "open", text)
    _, line, message = only_error(tmp_path)
    assert line in (1, 2) and needle in message


def test_hostile_yaml_is_refused_quickly(tmp_path):
    bomb = "---\nname: bomb\ndescription: x\na: &a [x, x, x, x, x, x, x, x, x]\nb: [*a, *a, *a]\n---\n"
    skill(tmp_path, "bomb", bomb)
    _, line, message = only_error(tmp_path)
    assert line == 5 and "aliases" in message
    skill(tmp_path, "bomb", "---\nname: bomb\ndescription: x\ndeep: " + "[" * 500 + "]" * 500 + "\n---\n")
    _, line, message = only_error(tmp_path)
    assert line == 4 and "nests deeper" in message
    skill(tmp_path, "bomb", "---\nname: bomb\ndescription: !!python/object:os.system x\n---\n")
    assert only_error(tmp_path)[2].startswith("bad YAML")


def test_a_key_given_twice_is_reported(tmp_path):
    skill(tmp_path, "twice", "---\nname: twice\ndescription: a\ndescription: b\n---\n")
    assert only_error(tmp_path)[1:] == (4, "key 'description' is given twice (first at line 3)")


def test_an_oversized_or_non_utf8_file_is_refused(tmp_path):
    path = skill(tmp_path, "big", GOOD.format(name="big"))
    path.write_bytes(path.read_bytes() + b"x" * MAX_FILE_BYTES)
    _, line, message = only_error(tmp_path)
    assert line == 1 and "larger than 256 KB" in message
    path.write_bytes(b"---\nname: big\ndescription: \xff\n---\n")
    assert "not valid UTF-8" in only_error(tmp_path)[2]


def test_the_file_listing_is_capped_and_skips_hidden_files(tmp_path):
    skill(tmp_path, "many", GOOD.format(name="many"))
    for n in range(80):
        (tmp_path / "many" / f"asset{n:02}.txt").write_text("x")
    (tmp_path / "many" / ".secret").write_text("x")
    doc = load_docs([tmp_path]).get("many")
    assert len(doc.files) == 50 and doc.more_files and ".secret" not in doc.files
    assert load_docs([tmp_path]).body("many").count("\n- ") == 51


# -- allowed-tools -------------------------------------------------------------

def test_allowed_tools_keeps_names_and_globs_and_warns_about_the_rest(tmp_path):
    assert allowed_entries("clock  files-read mcp:git/*") == (
        frozenset({"clock", "files-read", "mcp:git/*"}), [])
    assert allowed_entries(["clock", "Bash(git:*)", "a*b"]) == (frozenset({"clock"}),
                                                               ["Bash(git:*)", "a*b"])
    assert allowed_entries(None) == (None, [])
    path = skill(tmp_path, "git", "---\nname: git\ndescription: x\nallowed-tools: Bash(git:*)\n---\n")
    docs = load_docs([tmp_path])
    assert docs.allowed_tools("git") == frozenset()
    [warning] = docs.errors
    assert isinstance(warning, SkillWarning) and warning.line == 4
    assert str(warning).startswith(f"{path.absolute()}:4: warning: allowed-tools: ignored "
                                   "Bash(git:*)")
    assert "may use only: no tools" in str(warning)


def test_narrowing_only_takes_calls_away():
    assert narrowed("shell-anything", None)
    allowed = frozenset({"clock", "mcp:git/*"})
    assert narrowed("clock", allowed) and narrowed("mcp:git/log", allowed)
    assert not narrowed("files-write", allowed)
    assert not narrowed("mcp:git", allowed) and not narrowed("mcp:gitx/log", allowed)
    assert not narrowed("clock", frozenset())
    assert narrowed("skill-load", frozenset())


# -- the registry, the tool and the prompt ---------------------------------------

def test_the_registry_loads_skill_folders_beside_hy_skills(tmp_path, chat_dir):
    skill(tmp_path, "ok", GOOD.format(name="ok"))
    skill(tmp_path, "bad", "---\nname: bad\n---\n")
    (tmp_path / "greet.hy").write_text("(defskill greet :trigger (fn [ctx] True))\n")
    registry = SkillRegistry([chat_dir, tmp_path])
    errors = registry.load()
    assert [(e.path.name, e.line) for e in errors] == [("SKILL.md", 1)]
    assert registry.errors == errors
    assert {s.name for s in registry.skills} == {"chat", "greet"}
    assert registry.docs.catalogue() == {"ok": "Says what ok does."}


def test_the_first_directory_wins_a_name(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    skill(first, "same", GOOD.format(name="same"))
    skill(second, "same", GOOD.format(name="same").replace("Do the", "Also do the"))
    docs = load_docs([first, second])
    assert docs.get("same").folder == first / "same"
    assert ["already defined" in e.message for e in docs.errors] == [True]


def test_skill_load_returns_the_body_folder_and_files(chat_dir):
    registry = loaded(chat_dir, FIXTURE)
    tool = registry.tool_registry.get("skill-load")
    assert tool is not None and tool.risk == "read-only"
    assert registry.tool_registry.group_of("skill-load") == "skill-docs"
    args = registry.tool_registry.validate_call("skill-load", {"name": "release-notes"})
    answer = tool.run(tool.arguments(**args), None)
    folder = FIXTURE / "release-notes"
    assert f"Its folder: {folder}" in answer
    assert "- scripts/changes.sh" in answer and answer.endswith(
        "Answer with the notes as one org subtree; do not write any file.")
    with pytest.raises(ValueError, match="no skill named 'nope'; known skills: release-notes"):
        tool.run(tool.arguments(name="nope"), None)


def test_the_script_example_in_the_body_is_an_approved_shell_request(chat_dir):
    registry = loaded(chat_dir, FIXTURE)
    hint = registry.docs.body("release-notes").split("e.g. ", 1)[1].split("\n", 1)[0]
    script = FIXTURE / "release-notes" / "scripts" / "changes.sh"
    assert hint == f'(:type :REQUEST :target :shell :cmd ("bash" "{script}"))'
    ctx = context(registry)
    verdict = pin(judge(hint, registry.skills, ctx, registry.tool_registry), ctx.event,
                  ChatSettings(), can_ask=True)
    assert verdict.status == "needs-approval"


def test_no_skill_folders_means_no_tool_and_no_catalogue(chat_dir):
    registry = loaded(chat_dir)
    assert registry.tool_registry.get("skill-load") is None
    assert len(registry.docs) == 0
    prompt = registry.get("chat").probabilistic(context(registry))["system"]
    assert "Skills (" not in prompt and "skill-load" not in prompt


def test_the_chat_prompt_lists_the_catalogue_compactly(tmp_path, chat_dir):
    skill(tmp_path, "alpha", "---\nname: alpha\ndescription: |\n  First line.\n  Second line.\n---\n")
    registry = loaded(chat_dir, tmp_path, FIXTURE)
    ctx = context(registry, skills_catalogue=registry.docs.catalogue())
    prompt = registry.get("chat").probabilistic(ctx)["system"]
    lines = prompt.split("\n")
    header = lines.index("Skills (load one with the skill-load tool when it fits the request):")
    assert lines[header + 1] == "  - alpha: First line. Second line."
    assert lines[header + 2].startswith("  - release-notes: Drafts release notes")
    assert prompt.count("Skills (") == 1 and "Do the" not in prompt


def test_reload_picks_up_an_edited_skill_md(tmp_path, chat_dir):
    root = tmp_path / "skills"
    shutil.copytree(FIXTURE, root)
    registry = loaded(chat_dir, root)
    path = root / "release-notes" / "SKILL.md"
    path.write_text(path.read_text().replace("Drafts release notes", "Writes release notes")
                    .replace("# Release notes", "# Release notes, edited"))
    assert registry.reload() == []
    assert registry.docs.catalogue()["release-notes"].startswith("Writes release notes")
    tool = registry.tool_registry.get("skill-load")
    assert "# Release notes, edited" in tool.run(tool.arguments(name="release-notes"), None)
    path.write_text("---\nname: release-notes\n---\n")
    assert [e.line for e in registry.reload()] == [1]
    assert len(registry.docs) == 0 and registry.tool_registry.get("skill-load") is None
