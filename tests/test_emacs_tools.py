"""The bundled Emacs tools (skills/emacs-tools.org) in a real Emacs over real EPC.

The kernel's own `KernelEpcServer` and `EmacsLink` run in this process (their
loop on a thread); a real `emacs --batch` loads elisp/, connects through a
connection file as M-x opencortex-connect does, and serves the tool methods
while it waits.  The tools are loaded from the org note by a `SkillRegistry`
and called as the tool actuator would: `tool.run(arguments, ctx)` with a
`ToolContext` whose `emacs` is the link.  What Emacs did is read back through
the tools themselves and from the files on disk; at the end Emacs reports which
window was selected, so a shown file is known not to have taken the focus.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from epc_loop import LoopServer
from opencortex.emacs import EmacsLink
from opencortex.events import chat_message
from opencortex.skills.registry import SkillRegistry
from opencortex.tools import ToolRegistry
from opencortex.tools.context import ToolContext
from opencortex.tools.settings import ToolSettings

REPO = Path(__file__).resolve().parents[1]
ELISP = REPO / "elisp"
NOTE = REPO / "skills" / "emacs-tools.org"
NO_EMACS = ("No Emacs is connected; this tool works when the kernel runs under Emacs "
            "(M-x opencortex-chat).")
TOOL_NAMES = {"emacs-list-buffers", "emacs-read-buffer", "emacs-insert", "emacs-replace",
              "emacs-capture", "emacs-agenda", "emacs-open"}

pytestmark = pytest.mark.skipif(shutil.which("emacs") is None,
                                reason="emacs is not installed (tests/run.sh installs it)")

DRIVER = r"""
(require 'opencortex)
(let ((dir (file-name-as-directory {dir})))
  (find-file-noselect (expand-file-name "notes.txt" dir))
  (find-file-noselect (expand-file-name "replace.txt" dir))
  (with-current-buffer (find-file-noselect (expand-file-name "point.txt" dir)) (goto-char 4))
  (with-current-buffer (get-buffer-create "*locked*") (insert "locked") (setq buffer-read-only t))
  (with-current-buffer (get-buffer-create "region")
    (insert "first\nsecond\nthird\n")
    (goto-char 13)
    (set-mark 7))
  (setq org-agenda-files (list (expand-file-name "agenda.org" dir))))
(switch-to-buffer (opencortex--chat-buffer))
(opencortex-connect {connection})
(opencortex-wait-for (lambda () (file-exists-p {stop})) 240)
(with-temp-file {report}
  (insert (format "selected=%s\nshown=%s\n" (buffer-name (window-buffer (selected-window)))
                  (and (get-buffer-window "open.org") t))))
(opencortex-stop)
(kill-emacs 0)
"""


def lisp(value: object) -> str:
    return json.dumps(str(value), ensure_ascii=False)


def emacs_tools(directory: Path) -> dict:
    """The tools of the note, loaded by a SkillRegistry from a directory holding only it."""
    directory.mkdir()
    shutil.copy(NOTE, directory / NOTE.name)
    registry = SkillRegistry([directory], ToolRegistry())
    assert registry.load() == []
    return {tool.name: tool for tool in registry.tools}


class EmacsSession:
    """The kernel's EPC server and link here, a real Emacs connected to them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.link = EmacsLink(call_timeout=60)
        secret = secrets.token_hex(32)
        self.served = LoopServer(secret, {}, on_connect=self.link.connected,
                                 on_disconnect=self.link.disconnected)
        self.loop = self.served.loop
        connection = tmp / "kernel.json"
        descriptor = os.open(connection, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({"port": self.served.port, "secret": secret, "pid": os.getpid()}, handle)
        self.stop_file, self.report = tmp / "stop", tmp / "report"
        driver = tmp / "driver.el"
        driver.write_text(DRIVER.format(dir=lisp(tmp), connection=lisp(connection),
                                        stop=lisp(self.stop_file), report=lisp(self.report)),
                          encoding="utf-8")
        self.emacs = subprocess.Popen(["emacs", "--batch", "-L", str(ELISP), "-l", str(driver)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.stopped = False
        self._wait_for_connection(60)

    def _wait_for_connection(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.link.connections:
            if self.emacs.poll() is not None or time.monotonic() > deadline:
                output = self.stop()
                raise AssertionError(f"Emacs did not connect:\n{output[-4000:]}")
            time.sleep(0.02)

    def run(self, value, timeout: float = 90):
        """VALUE, awaited on the kernel's loop when it is awaitable."""
        if not inspect.isawaitable(value):
            return value
        return asyncio.run_coroutine_threadsafe(value, self.loop).result(timeout)

    def stop(self) -> str:
        """Let Emacs report and exit (bounded), stop the server; Emacs's output."""
        if self.stopped:
            return ""
        self.stopped = True
        self.stop_file.write_text("")
        try:
            output, _ = self.emacs.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.emacs.kill()
            output, _ = self.emacs.communicate(timeout=10)
        self.served.stop()
        return output


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("emacs-tools")
    (tmp / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (tmp / "replace.txt").write_text("".join(f"l{i}\n" for i in range(1, 11)))
    (tmp / "point.txt").write_text("ab\ncd\n")
    (tmp / "open.org").write_text("* First\ntext\n* Second heading\nmore\n")
    (tmp / "agenda.org").write_text(
        "* TODO Call Bob\nSCHEDULED: <2031-03-04 Tue 10:00>\n"
        "* Pay rent\nDEADLINE: <2031-03-06 Thu>\n"
        "* Later\n<2031-05-01 Thu>\n")
    return tmp


@pytest.fixture(scope="module")
def session(files):
    emacs = EmacsSession(files)
    yield emacs
    emacs.stop()


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> dict:
    return emacs_tools(tmp_path_factory.mktemp("skills") / "only")


def context(emacs, **settings) -> ToolContext:
    return ToolContext(event=chat_message("hi", "emacs", "main"),
                       settings=ToolSettings(**settings), emacs=emacs)


def call(session, tool, ctx, **args):
    return session.run(tool.run(tool.arguments.model_validate(args), ctx))


def preview(session, tool, ctx, **args):
    return session.run(tool.preview(tool.arguments.model_validate(args), ctx))


def test_the_note_defines_the_seven_tools_with_their_risks(tools):
    assert set(tools) == TOOL_NAMES
    assert {name for name, tool in tools.items() if tool.risk == "writes"} == {
        "emacs-insert", "emacs-replace", "emacs-capture", "emacs-open"}
    assert tools["emacs-read-buffer"].needs_approval is not None
    assert all(tools[name].preview for name in ("emacs-insert", "emacs-replace", "emacs-capture"))


def test_list_and_read_buffers(session, tools, files):
    ctx = context(session.link)
    listing = call(session, tools["emacs-list-buffers"], ctx)
    assert f"notes.txt | text-mode | {files / 'notes.txt'} | unmodified | 17 chars" in listing
    assert "*locked* | fundamental-mode | (no file) | modified | 6 chars" in listing
    assert "*opencortex-chat* | opencortex-chat-mode" in listing
    read = tools["emacs-read-buffer"]
    assert call(session, read, ctx, buffer="notes.txt") == "alpha\nbeta\ngamma\n"
    assert call(session, read, ctx, buffer="notes.txt", max_chars=5) == (
        "alpha\n[… the first 5 of 17 characters; ask with a larger max-chars, or read a region]")
    assert call(session, read, ctx, buffer="region", region=True) == "second"
    with pytest.raises(Exception, match="^No buffer is called nope"):
        call(session, read, ctx, buffer="nope")
    asks = read.needs_approval
    assert "notes.txt" in asks(read.arguments.model_validate({"buffer": "notes.txt"}), ctx)
    assert asks(read.arguments.model_validate({"buffer": "*opencortex-chat*"}), ctx) is None
    assert asks(read.arguments.model_validate({"buffer": "notes.txt"}), context(None)) is None


def test_insert_shows_the_diff_then_inserts_visible_text(session, tools):
    ctx = context(session.link)
    insert = tools["emacs-insert"]
    diff = preview(session, insert, ctx, buffer="notes.txt", text="delta\x1b[31m\n")
    assert diff == ("--- notes.txt (now)\n+++ notes.txt (after the change)\n@@ -1,3 +1,4 @@\n"
                    " alpha\n beta\n gamma\n+delta␛[31m")
    assert call(session, insert, ctx, buffer="notes.txt", text="delta\x1b[31m\n") == (
        "Inserted 11 characters into notes.txt at line 4 (end).")
    assert call(session, tools["emacs-read-buffer"], ctx, buffer="notes.txt") == (
        "alpha\nbeta\ngamma\ndelta␛[31m\n")
    assert call(session, insert, ctx, buffer="point.txt", text="X", at="point") == (
        "Inserted 1 character into point.txt at line 2 (point).")
    assert call(session, tools["emacs-read-buffer"], ctx, buffer="point.txt") == "ab\nXcd\n"


def test_insert_refuses_what_it_cannot_do(session, tools):
    ctx = context(session.link)
    insert = tools["emacs-insert"]
    with pytest.raises(Exception, match=r"^Buffer \*locked\* is read-only$"):
        call(session, insert, ctx, buffer="*locked*", text="x")
    with pytest.raises(Exception, match="^No buffer is called nope"):
        call(session, insert, ctx, buffer="nope", text="x")
    assert preview(session, insert, ctx, buffer="nope", text="x").startswith(
        "(the change cannot be shown: No buffer is called nope")
    with pytest.raises(Exception, match="^The chat buffer is written by replies"):
        call(session, insert, ctx, buffer="*opencortex-chat*", text="x")
    assert "nope" not in call(session, tools["emacs-list-buffers"], ctx)


def test_replace_shows_the_diff_with_buffer_line_numbers(session, tools):
    ctx = context(session.link)
    replace = tools["emacs-replace"]
    assert preview(session, replace, ctx, buffer="replace.txt", old="l7", new="seven") == (
        "--- replace.txt (now)\n+++ replace.txt (after the change)\n@@ -4,7 +4,7 @@\n"
        " l4\n l5\n l6\n-l7\n+seven\n l8\n l9\n l10")
    assert call(session, replace, ctx, buffer="replace.txt", old="l7", new="seven") == (
        "Replaced 2 characters with 5 at line 7 of replace.txt.")
    with pytest.raises(Exception, match="occurs more than once in replace.txt"):
        call(session, replace, ctx, buffer="replace.txt", old="l1", new="one")
    with pytest.raises(Exception, match="does not occur in replace.txt"):
        call(session, replace, ctx, buffer="replace.txt", old="l7", new="again")
    assert preview(session, replace, ctx, buffer="replace.txt", old="zz", new="y").startswith(
        "(the change cannot be shown: The text to replace does not occur in replace.txt")
    text = call(session, tools["emacs-read-buffer"], ctx, buffer="replace.txt")
    assert text == "l1\nl2\nl3\nl4\nl5\nl6\nseven\nl8\nl9\nl10\n"


def test_capture_files_an_org_entry(session, tools, files):
    capture = tools["emacs-capture"]
    inbox = files / "inbox.org"
    ctx = context(session.link, capture_file=inbox)
    assert session.run(capture.preview(
        capture.arguments.model_validate({"text": "Buy milk\nand bread"}), ctx)) == (
        f"A new entry at the end of {inbox}:\n* Buy milk\nBuy milk\nand bread")
    assert call(session, capture, ctx, text="Buy milk\n* and bread") == (
        f"Filed the note \"Buy milk\" in {inbox} at line 1.")
    lines = inbox.read_text().split("\n")
    assert lines[:2] == ["* Buy milk", ":PROPERTIES:"]
    assert lines[2].startswith(":CREATED:") and lines[3:] == [":END:", "Buy milk", ",* and bread", ""]
    assert "inbox.org" not in call(session, tools["emacs-list-buffers"], ctx)
    with pytest.raises(Exception, match="no capture file is configured"):
        call(session, capture, context(session.link), text="x")


def test_agenda_lists_the_entries_of_the_range(session, tools, files):
    ctx = context(session.link)
    agenda = tools["emacs-agenda"]
    assert call(session, agenda, ctx, from_date="2031-03-01", to_date="2031-03-31") == (
        f"2031-03-04 10:00 TODO Call Bob [scheduled] ({files / 'agenda.org'})\n"
        f"2031-03-06 Pay rent [deadline] ({files / 'agenda.org'})")
    assert call(session, agenda, ctx, from_date="2031-04-01", to_date="2031-04-02") == (
        "No agenda entries from 2031-04-01 to 2031-04-02.")
    with pytest.raises(Exception, match="from-date must be a date YYYY-MM-DD"):
        call(session, agenda, ctx, from_date="March", to_date="2031-04-02")
    with pytest.raises(Exception, match="longer than 366 days"):
        call(session, agenda, ctx, from_date="2031-01-01", to_date="2032-06-01")


def test_open_shows_the_file_at_its_heading_without_the_focus(session, tools, files):
    ctx = context(session.link)
    opened = call(session, tools["emacs-open"], ctx, file=str(files / "open.org"),
                  heading="Second heading")
    assert opened == (f"Opened {files / 'open.org'} at the heading \"Second heading\" (line 3); "
                      "it is shown in another window.")
    with pytest.raises(Exception, match="open.org has no heading Third"):
        call(session, tools["emacs-open"], ctx, file=str(files / "open.org"), heading="Third")
    with pytest.raises(Exception, match="absolute path"):
        call(session, tools["emacs-open"], ctx, file="open.org")
    output = session.stop()
    assert (files / "report").read_text() == "selected=*opencortex-chat*\nshown=t\n", output


def test_without_emacs_every_tool_says_so(tools):
    ctx = context(None, capture_file=Path("/tmp/inbox.org"))
    arguments = {"emacs-list-buffers": {}, "emacs-read-buffer": {"buffer": "b"},
                 "emacs-insert": {"buffer": "b", "text": "t"},
                 "emacs-replace": {"buffer": "b", "old": "o", "new": "n"},
                 "emacs-capture": {"text": "t"},
                 "emacs-agenda": {"from_date": "2031-01-01", "to_date": "2031-01-02"},
                 "emacs-open": {"file": "/tmp/x.org"}}
    for name, tool in tools.items():
        args = tool.arguments.model_validate(arguments[name])
        assert asyncio.run(tool.run(args, ctx)) == NO_EMACS, name
    for name in ("emacs-insert", "emacs-replace"):
        tool = tools[name]
        assert asyncio.run(tool.preview(tool.arguments.model_validate(arguments[name]), ctx)) == (
            NO_EMACS)


def test_a_link_without_a_connection_fails_with_a_clear_message(tools):
    ctx = context(EmacsLink())
    with pytest.raises(Exception, match="Emacs is not connected; run M-x opencortex-chat"):
        asyncio.run(tools["emacs-list-buffers"].run(
            tools["emacs-list-buffers"].arguments.model_validate({}), ctx))
