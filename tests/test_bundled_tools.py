"""The bundled skills' tools (files, memory, notes) and the remember skill, loaded
from the real skills/ directory and run with a ToolContext built by hand."""

from __future__ import annotations

import asyncio
import os
import re
from datetime import datetime
from pathlib import Path

import orgparse
import pytest

from opencortex.conversation.branches import control_message
from opencortex.conversation.conversations import Conversations
from opencortex.conversation.delivery import NOT_DELIVERED, delivery_mark
from opencortex.conversation.recall import Recall
from opencortex.conversation.settings import ConversationSettings
from opencortex.events import Thread, chat_message
from opencortex.memory import Archive, NewMessage
from opencortex.memory.orgformat import decode_body
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.tools.context import ToolContext
from opencortex.tools.memory_view import OwnerMemory
from opencortex.tools.settings import ToolSettings
from opencortex.verification import judge

REPO = Path(__file__).resolve().parents[1]
CLI = Thread("cli", "local")
EMACS = Thread("emacs", "main")
ALICE = Thread("telegram", "1001")
BOB = Thread("telegram", "1002")


@pytest.fixture(scope="module")
def skills() -> SkillRegistry:
    registry = SkillRegistry([REPO / "skills"])
    assert registry.load() == []
    return registry


def context(settings: ToolSettings | None = None, *, memory=None, thread: Thread = CLI,
            text: str = "hi") -> ToolContext:
    event = chat_message(text, thread.channel, thread.chat_id)
    return ToolContext(event, settings or ToolSettings(), memory=memory)


def run(skills: SkillRegistry, name: str, ctx: ToolContext, **args) -> str:
    """Call tool NAME as the kernel does: validate the call, then run it (bounded)."""
    checked = skills.tool_registry.validate_call(name, {k.replace("_", "-"): v
                                                        for k, v in args.items()})
    tool = skills.tool_registry.get(name)
    model = tool.arguments.model_validate({k.replace("-", "_"): v for k, v in checked.items()})

    async def call():
        return await asyncio.wait_for(tool.run(model, ctx), 10)
    return asyncio.run(call())


def test_every_bundled_tool_is_registered_with_its_risk(skills):
    ours = {"files-read": "read-only", "files-list": "read-only", "memory-search": "read-only",
            "memory-show": "read-only", "notes-file": "writes"}
    tools = {tool.name: tool for tool in skills.tools if tool.name in ours}
    assert {name: tool.risk for name, tool in tools.items()} == ours
    assert {tool.source.name for tool in tools.values()} == {"files.org", "memory.org",
                                                             "remember.org"}


# -- files ------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    """root/ with a few files, outside/ with a secret, and symlinks between them."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.txt").write_text("hello\nworld\n")
    (root / "sub" / "b.txt").write_text("in sub")
    (outside / "secret.txt").write_text("SECRET")
    (root / "escape").symlink_to(outside / "secret.txt")
    (root / "escape-dir").symlink_to(outside)
    (root / "inner").symlink_to(root / "sub" / "b.txt")
    (tmp_path / "root-link").symlink_to(root)
    return tmp_path


def files(tree: Path, *roots: str) -> ToolContext:
    return context(ToolSettings(roots=[tree / r for r in roots or ("root",)]))


def test_files_read_reads_inside_a_root(skills, tree):
    ctx = files(tree)
    assert run(skills, "files-read", ctx, path="a.txt") == "hello\nworld\n"
    assert run(skills, "files-read", ctx, path="sub/../sub/b.txt") == "in sub"
    assert run(skills, "files-read", ctx, path=str(tree / "root" / "a.txt")) == "hello\nworld\n"
    assert run(skills, "files-read", ctx, path="inner") == "in sub"   # a link that stays inside


@pytest.mark.parametrize("path", ["escape", "escape-dir/secret.txt", "../outside/secret.txt",
                                  "sub/../../outside/secret.txt", "/etc/passwd",
                                  "{tree}/outside/secret.txt", "/nonexistent/file",
                                  "../outside/missing.txt"])
def test_files_read_refuses_everything_outside_the_roots(skills, tree, path):
    with pytest.raises(PermissionError, match="outside the directories open"):
        run(skills, "files-read", files(tree), path=path.format(tree=tree))


def test_a_symlinked_root_stands_for_its_target(skills, tree):
    ctx = files(tree, "root-link")
    assert run(skills, "files-read", ctx, path="a.txt") == "hello\nworld\n"
    assert run(skills, "files-read", ctx, path=str(tree / "root" / "a.txt")) == "hello\nworld\n"
    with pytest.raises(PermissionError):
        run(skills, "files-read", ctx, path="../outside/secret.txt")
    with pytest.raises(PermissionError):
        run(skills, "files-read", ctx, path="escape")


def test_files_tools_say_clearly_when_no_root_is_configured(skills, tree):
    for name, args in (("files-read", {"path": "a.txt"}), ("files-list", {})):
        with pytest.raises(PermissionError, match=r"no directories are open.*roots"):
            run(skills, name, context(), **args)
    relative = context(ToolSettings(roots=[Path("relative/dir"), tree / "missing"]))
    with pytest.raises(PermissionError, match="none of the \\[tools\\] roots"):
        run(skills, "files-read", relative, path="a.txt")


def test_a_missing_file_inside_a_root_is_reported_missing(skills, tree):
    with pytest.raises(FileNotFoundError, match="no such file"):
        run(skills, "files-read", files(tree), path="nope.txt")


def test_files_read_refuses_binary_files_fifos_and_directories(skills, tree):
    root = tree / "root"
    (root / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    os.mkfifo(root / "pipe")
    with pytest.raises(ValueError, match="binary file"):
        run(skills, "files-read", files(tree), path="image.bin")
    with pytest.raises(IsADirectoryError, match="not a regular file"):
        run(skills, "files-read", files(tree), path="pipe")     # never blocks on the FIFO
    with pytest.raises(IsADirectoryError, match="files-list"):
        run(skills, "files-read", files(tree), path="sub")


def test_files_read_caps_what_it_returns(skills, tree):
    root = tree / "root"
    (root / "big.txt").write_text("x" * 300_000)
    (root / "odd.txt").write_bytes(b"caf\xc3\xa9 \xff end")
    cut = run(skills, "files-read", files(tree), path="big.txt", max_chars=5)
    assert cut.startswith("xxxxx\n[... cut: the first 5 characters of a 300000-byte file")
    capped = run(skills, "files-read", files(tree), path="big.txt", max_chars=10**9)
    assert capped.count("x") == 200_000
    assert run(skills, "files-read", files(tree), path="odd.txt") == "café \ufffd end"
    with pytest.raises(ValueError, match="at least 1"):
        run(skills, "files-read", files(tree), path="a.txt", max_chars=0)


def test_files_list_shows_kinds_sizes_and_escaped_names(skills, tree):
    (tree / "root" / "two\nlines").write_text("")
    listing = run(skills, "files-list", files(tree)).split("\n")
    assert listing[0] == f"{tree / 'root'}: 6 entries"
    assert listing[1:] == ["file  a.txt  12 bytes", "link  escape", "link  escape-dir",
                           "link  inner", "dir   sub/", "file  two\\nlines  0 bytes"]
    assert run(skills, "files-list", files(tree), path="sub") == \
        f"{tree / 'root' / 'sub'}: 1 entry\nfile  b.txt  6 bytes"
    with pytest.raises(NotADirectoryError, match="files-read"):
        run(skills, "files-list", files(tree), path="a.txt")
    with pytest.raises(PermissionError):
        run(skills, "files-list", files(tree), path="escape-dir")


def test_files_list_caps_the_entries_shown(skills, tree):
    many = tree / "root" / "many"
    many.mkdir()
    for n in range(205):
        (many / f"f{n:03d}").write_text("")
    listing = run(skills, "files-list", files(tree), path="many").split("\n")
    assert listing[0].endswith(": 205 entries") and len(listing) == 202
    assert listing[-1] == "... 205 in all; the first 200 by name are shown"


# -- memory -----------------------------------------------------------------------------


def at(day: str, clock: str) -> float:
    return datetime.fromisoformat(f"{day}T{clock}").timestamp()


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


def say(thread: Thread, text: str, when: float, role: str = "user") -> NewMessage:
    return NewMessage(role=role, text=text, thread=thread, timestamp=when)


def memory(skills, archive, thread: Thread, **settings) -> ToolContext:
    conversations = Conversations(archive, ConversationSettings(**settings))
    return context(memory=OwnerMemory.of(conversations, thread), thread=thread)


def test_memory_search_finds_the_owners_messages_on_every_channel(skills, archive):
    archive.append([say(CLI, "the staging database listens on port 5433",
                        at("2026-03-14", "10:00")),
                    say(CLI, "noted,\nport 5433\n* it is", at("2026-03-14", "10:01"), "assistant")])
    archive.append([say(EMACS, "staging database backups run nightly", at("2026-03-15", "09:00"))])
    found = run(skills, "memory-search", memory(skills, archive, EMACS), query="staging port")
    lines = found.split("\n")
    assert all(re.fullmatch(r"2026-03-1[45] (cli|emacs):\S+ (user|assistant): .+", line)
               for line in lines), lines
    assert "2026-03-14 cli:local user: the staging database listens on port 5433" in lines
    assert "2026-03-14 cli:local assistant: noted, port 5433 * it is" in lines  # one line
    assert any(line.startswith("2026-03-15 emacs:main user:") for line in lines)
    one = run(skills, "memory-search", memory(skills, archive, EMACS), query="staging", limit=1)
    assert len(one.split("\n")) == 1
    assert run(skills, "memory-search", memory(skills, archive, CLI), query="zebra") == \
        'Nothing found for "zebra".'


def test_memory_search_of_only_very_common_words_finds_the_newest(skills, archive):
    """Recall brings nothing for such words (test_recall_ranking); a search the model asks
    for still finds their newest matches."""
    archive.append([say(CLI, f"standup notes {i}", at("2026-03-14", f"10:{i:02d}"))
                    for i in range(60)])
    view = memory(skills, archive, EMACS).memory
    assert [hit["text"] for hit in view.search("standup notes", 2)] == [
        "standup notes 59", "standup notes 58"]
    assert view.recall.recall(EMACS, "standup notes") == []


def test_memory_never_shows_another_owners_canary(skills, archive):
    day = "2026-03-14"
    archive.append([say(BOB, "canary7731 is bob's secret word", at(day, "10:00"))])
    archive.append([say(ALICE, "alice talks about a canary bird", at(day, "10:05"))])
    archive.append([say(CLI, "the local user mentions canary too", at(day, "10:10"))])
    for thread in (ALICE, CLI, EMACS):
        ctx = memory(skills, archive, thread)
        assert "canary7731" not in run(skills, "memory-search", ctx, query="canary7731 canary")
        assert "canary7731" not in run(skills, "memory-show", ctx, date=day)
        view = ctx.memory
        assert all(hit["thread"] != str(BOB) for hit in view.search("canary7731 secret", 20))
        assert all(m["thread"] == str(thread) for m in view.messages(None, None, 500))
    own = run(skills, "memory-search", memory(skills, archive, BOB), query="canary7731")
    assert own == f"{day} telegram:1002 user: canary7731 is bob's secret word"
    shared = memory(skills, archive, ALICE, recall_across_owners=["telegram:1002"])
    assert "canary7731" in run(skills, "memory-search", shared, query="canary7731")


def test_memory_show_by_date_oldest_first(skills, archive):
    archive.append([say(CLI, "late on the 14th", at("2026-03-14", "18:00"))])
    archive.append([say(CLI, "early on the 14th", at("2026-03-14", "08:00")),
                    say(CLI, "reply on the 14th", at("2026-03-14", "08:01"), "assistant")])
    archive.append([say(CLI, "on the 15th", at("2026-03-15", "09:00"))])
    archive.append([say(CLI, "on the 13th", at("2026-03-13", "23:59"))])
    archive.append([control_message(CLI, "pin", target=None, branch="main", text="Pinned x")])
    archive.append([NewMessage(role="system", text="System Error: boom", thread=CLI,
                               timestamp=at("2026-03-14", "12:00"))])
    archive.append([say(EMACS, "same owner, other thread", at("2026-03-14", "12:00"))])
    ctx = memory(skills, archive, CLI)
    assert run(skills, "memory-show", ctx, date="2026-03-14") == "\n".join([
        "2026-03-14 08:00 user: early on the 14th",
        "2026-03-14 08:01 assistant: reply on the 14th",
        "2026-03-14 18:00 user: late on the 14th"])
    both = run(skills, "memory-show", ctx, from_date="2026-03-14T12:00", to_date="2026-03-15")
    assert both.split("\n") == ["2026-03-14 18:00 user: late on the 14th",
                                "2026-03-15 09:00 user: on the 15th"]
    since = run(skills, "memory-show", ctx, from_date="2026-03-15")
    assert since == "2026-03-15 09:00 user: on the 15th"
    first = run(skills, "memory-show", ctx, date="2026-03-14", limit=1).split("\n")
    assert first[0] == "2026-03-14 08:00 user: early on the 14th"
    assert first[1].startswith('... more messages follow; ask again with :from-date '
                               '"2026-03-14T08:00:00"')
    assert run(skills, "memory-show", ctx, date="2026-01-01") == \
        "No messages in this conversation in that period."


def test_memory_tools_explain_bad_arguments(skills, archive):
    ctx = memory(skills, archive, CLI)
    with pytest.raises(ValueError, match="either :date"):
        run(skills, "memory-show", ctx, date="2026-03-14", to_date="2026-03-15")
    with pytest.raises(ValueError, match=":date must be an ISO date"):
        run(skills, "memory-show", ctx, date="last tuesday")
    with pytest.raises(ValueError, match="say which messages"):
        run(skills, "memory-show", ctx)
    with pytest.raises(ValueError, match="query is empty"):
        run(skills, "memory-search", ctx, query="  ")
    with pytest.raises(ValueError, match="at least 1"):
        run(skills, "memory-search", ctx, query="x", limit=0)
    with pytest.raises(RuntimeError, match="memory is not available"):
        run(skills, "memory-search", context(), query="x")


def test_owner_memory_reads_working_memory_for_an_unarchived_channel(archive):
    conversations = Conversations(archive, ConversationSettings(), unarchived=["telegram"])
    conversations.working.append([say(ALICE, "kept in working memory", at("2026-03-14", "10:00"))])
    view = OwnerMemory.of(conversations, ALICE)
    assert [m["text"] for m in view.messages()] == ["kept in working memory"]
    assert view.owner == "telegram:1001"
    assert OwnerMemory(Recall(archive, {}), CLI).store is archive


# -- remember ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["remember this: the door code is 4711",
                                  "  Remember that: Alice is vegetarian",
                                  "REMEMBER: buy milk", "remember :spacing too"])
def test_remember_wins_over_chat_for_remember_messages(skills, text):
    chosen = skills.matching(SkillContext(event=chat_message(text)))
    assert chosen[0].name == "remember" and "chat" in [skill.name for skill in chosen]
    assert chosen[0].priority > skills.get("chat").priority
    assert chosen[0].pins_turn and not skills.get("chat").pins_turn


@pytest.mark.parametrize("text", ["hello", "remember to buy milk", "do you remember this?",
                                  "I said remember this: x", "remembering: no"])
def test_chat_keeps_winning_otherwise(skills, text):
    names = [s.name for s in skills.matching(SkillContext(event=chat_message(text)))]
    assert names[0] == "chat" and "remember" not in names


def test_remember_prompt_asks_for_the_notes_file_call(skills):
    event = chat_message("remember this: the door code is 4711")
    history = [type("E", (), {"role": "user", "text": "we moved to flat 3b", "kind": "message"})()]
    request = skills.get("remember").probabilistic(SkillContext(event=event, history=history))
    assert '(:type :REQUEST :target :tool :action :call :tool "notes-file"' in request["system"]
    assert ":type :RESPONSE" in request["system"]
    [message] = request["messages"]
    assert message["content"].endswith("\n\nremember this: the door code is 4711")
    assert "user: we moved to flat 3b" in message["content"]


def verdict(skills, reply: str, event):
    return judge(reply, skills.skills, SkillContext(event=event, config={
        "buffer": "*opencortex-chat*", "allowed-buffers": [], "history-chars": 4000}),
        skills.tool_registry)


def test_remember_verifier_passes_only_the_note_and_a_reply_here(skills):
    event = chat_message("remember: door code 4711", "telegram", "1001")
    note = '(:type :REQUEST :target :tool :action :call :tool "notes-file" :args (:text "x"))'
    assert verdict(skills, note, event).status == "accepted"
    assert verdict(skills, '(:type :RESPONSE :text "Noted.")', event).status == "accepted"
    here = '(:type :REQUEST :target :telegram :chat-id "1001" :text "Noted.")'
    assert verdict(skills, here, event).status == "accepted"
    for other in ['(:type :REQUEST :target :tool :action :call :tool "files-read" '
                  ':args (:path "a"))',
                  '(:type :REQUEST :target :telegram :chat-id "1002" :text "Noted.")',
                  '(:type :LOG :text "thinking")',
                  '(:type :REQUEST :target :shell :cmd "ls")']:
        judged = verdict(skills, other, event)
        assert judged.status == "rejected", other
        assert "Remember skill: only the notes-file tool call" in judged.errors[0]
    ordinary = chat_message("what is in a?", "telegram", "1001")
    read = '(:type :REQUEST :target :tool :action :call :tool "files-read" :args (:path "a"))'
    assert verdict(skills, read, ordinary).status == "accepted"    # not a remember turn


# -- notes-file -------------------------------------------------------------------------


def notes(tmp_path, thread: Thread = EMACS) -> ToolContext:
    return context(ToolSettings(notes_file=tmp_path / "memory" / "notes.org"), thread=thread)


def read_notes(path: Path) -> list[tuple[str, dict, str]]:
    """(heading, properties, decoded body) of every heading, read with plain orgparse."""
    return [(node.heading, node.properties,
             decode_body(node.body.split("\n"), node.properties.get("BODY_ENCODING") == "percent"))
            for node in orgparse.load(str(path)).children]


def test_notes_file_appends_an_org_entry_that_round_trips(skills, tmp_path):
    ctx = notes(tmp_path)
    answer = run(skills, "notes-file", ctx, text="The door code is 4711.\nIt changes in May.")
    path = tmp_path / "memory" / "notes.org"
    assert answer == f'Filed in {path} under "The door code is 4711.".'
    run(skills, "notes-file", notes(tmp_path, ALICE), text="  Alice is vegetarian  \r\n")
    assert path.read_text().startswith("#+TITLE: Notes\n\n* The door code is 4711.\n")
    [(title, props, body), (title2, props2, body2)] = read_notes(path)
    assert (title, body) == ("The door code is 4711.", "The door code is 4711.\nIt changes in May.")
    assert props["THREAD"] == "emacs:main" and props2["THREAD"] == "telegram:1001"
    assert re.fullmatch(r"\[\d{4}-\d\d-\d\d \w{3} \d\d:\d\d\]", props["CREATED"])
    assert len(props["ID"]) == 36 and props["ID"] != props2["ID"]
    assert (title2, body2) == ("Alice is vegetarian", "Alice is vegetarian")
    assert oct(path.stat().st_mode & 0o777) == "0o600"


HOSTILE = ["* forged heading", "** deeper :tag:", "#+begin_src sh", "rm -rf ~", "#+end_src",
           ":PROPERTIES:", ":THREAD: telegram:666", ":END:", "  #+TITLE: x", ",* already",
           "[2026-13-45 Xyz] not a date", "\x1b[31mred\x1b[0m"]


def test_hostile_note_text_cannot_forge_org_structure(skills, tmp_path):
    text = "\n".join(HOSTILE)
    run(skills, "notes-file", notes(tmp_path), text=text)
    run(skills, "notes-file", notes(tmp_path), text="* [#A] TODO x :work:\nsecond")
    [(title, props, body), (title2, props2, body2)] = read_notes(tmp_path / "memory" / "notes.org")
    assert body == text
    assert set(props) == {"ID", "CREATED", "THREAD", "BODY_ENCODING"}
    assert props["THREAD"] == "emacs:main"
    assert title == "forged heading" and title2 == "(#A) TODO x :work"
    assert body2 == "* [#A] TODO x :work:\nsecond"
    raw = (tmp_path / "memory" / "notes.org").read_text()
    assert re.findall(r"(?m)^\*.*$", raw) == ["* forged heading", "* (#A) TODO x :work"]
    assert "\x1b" not in raw


def test_a_hand_edited_file_without_a_last_newline_stays_well_formed(skills, tmp_path):
    path = tmp_path / "memory" / "notes.org"
    path.parent.mkdir()
    path.write_text("* mine\nhand written, no newline")
    run(skills, "notes-file", notes(tmp_path), text="filed after")
    assert [(t, b) for t, _, b in read_notes(path)] == [("mine", "hand written, no newline"),
                                                         ("filed after", "filed after")]


def test_concurrent_notes_are_each_written_whole(skills, tmp_path):
    tool = skills.tool_registry.get("notes-file")
    ctx = notes(tmp_path)

    async def many():
        calls = [tool.run(tool.arguments(text=f"note {n}\n* line {n}"), ctx) for n in range(20)]
        await asyncio.wait_for(asyncio.gather(*calls), 20)
    asyncio.run(many())
    found = read_notes(tmp_path / "memory" / "notes.org")
    assert sorted(body for _, _, body in found) == sorted(f"note {n}\n* line {n}"
                                                          for n in range(20))


def test_notes_file_refuses_what_it_cannot_file_and_previews_without_writing(skills, tmp_path):
    with pytest.raises(RuntimeError, match="no notes file is configured"):
        run(skills, "notes-file", context(), text="x")
    with pytest.raises(ValueError, match="the note is empty"):
        run(skills, "notes-file", notes(tmp_path), text=" \n ")
    with pytest.raises(ValueError, match="unpaired surrogate"):
        run(skills, "notes-file", notes(tmp_path), text="bad \udc80 byte")
    with pytest.raises(ValueError, match="at most 20000"):
        run(skills, "notes-file", notes(tmp_path), text="x" * 20_001)
    tool = skills.tool_registry.get("notes-file")
    shown = tool.preview(tool.arguments(text="* door code 4711"), notes(tmp_path))
    assert shown.startswith(f"Append to {tmp_path / 'memory' / 'notes.org'}:\n* door code 4711\n")
    assert ",* door code 4711" in shown
    assert not (tmp_path / "memory" / "notes.org").exists()


def test_a_file_swapped_after_the_check_is_caught_on_the_open_descriptor(skills, tree):
    import sys

    import hy
    [module] = [m for name, m in sys.modules.items() if name.startswith("opencortex_skill_files_")
                and m.__file__ == str(REPO / "skills" / "files.org")][-1:]
    opened_inside = getattr(module, hy.mangle("opened-inside?"))
    roots = [(tree / "root").resolve()]
    for path, inside in ((tree / "outside" / "secret.txt", False), (tree / "root" / "a.txt", True)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert opened_inside(fd, roots) is inside
        finally:
            os.close(fd)


def test_memory_shows_a_reply_the_person_never_got_as_such(skills, archive):
    question, reply = archive.append([
        say(CLI, "where is the harbour", at("2026-03-14", "10:00")),
        say(CLI, "the harbour is past the lighthouse", at("2026-03-14", "10:01"), "assistant")])
    archive.append([delivery_mark(CLI, reply.id, "main", "the platform refused it")])
    view = memory(skills, archive, EMACS).memory
    found = {hit["id"]: hit for hit in view.search("harbour lighthouse", 5)}
    assert found[reply.id]["delivered"] is False and found[question.id]["delivered"] is True
    assert found[reply.id]["text"] == NOT_DELIVERED + "the harbour is past the lighthouse"
    shown = run(skills, "memory-show", memory(skills, archive, CLI), date="2026-03-14")
    assert shown.split("\n") == [
        "2026-03-14 10:00 user: where is the harbour",
        f"2026-03-14 10:01 assistant: {NOT_DELIVERED}the harbour is past the lighthouse"]
