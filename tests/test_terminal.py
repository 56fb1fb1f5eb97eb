"""The terminal chat, run as a person runs it: a real process on a real pseudo-terminal.

Each test starts `opencortex chat` on a pty it owns (the pty is the process's
controlling terminal, so Ctrl-C is a real SIGINT while a turn runs), types
bytes, and reads what the terminal receives, answering the cursor position
requests a terminal answers.  Every read has a deadline; every process is
stopped by the test that started it.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import cli_env
from opencortex.actions import reply_action
from opencortex.terminal_output import NOT_KEPT, RETRYING, TerminalOutput, status_line

DEADLINE = 60.0          # seconds any one wait may take before the test fails
ROWS, COLS = 30, 120
CPR_REQUEST = b"\x1b[6n"
UP, LEFT = b"\x1b[A", b"\x1b[D"
ENTER, ALT_ENTER, CTRL_J = b"\r", b"\x1b\r", b"\n"
CTRL_C, CTRL_D = b"\x03", b"\x04"


def _take_terminal() -> None:
    """In the child: make the pty (stdin) the controlling terminal of its new session."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtyChat:
    """`opencortex chat` on a pseudo-terminal: type bytes, read what the terminal gets."""

    def __init__(self, home: Path, *args: str):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        command = [sys.executable, "-m", "opencortex", "chat", "--home", str(home), *args]
        self.proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave,
                                     env=cli_env(home, TERM="xterm"), start_new_session=True,
                                     preexec_fn=_take_terminal)
        os.close(slave)
        self.master = master
        self.output = b""
        self._scanned = 0

    def _read(self, wait: float) -> bool:
        """Read what is there (waiting up to WAIT s); False once the terminal is closed."""
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every process holding the pty has gone
            return False
        if not data:
            return False
        self.output += data
        start = max(0, self._scanned - len(CPR_REQUEST))
        for _ in range(self.output.count(CPR_REQUEST, start)):
            os.write(self.master, f"\x1b[{ROWS};1R".encode())
        self._scanned = len(self.output)
        return True

    def mark(self) -> int:
        return len(self.output)

    def expect(self, needle: str | bytes, start: int = 0) -> int:
        """Wait until NEEDLE was received after offset START; the offset just past it."""
        wanted = needle.encode() if isinstance(needle, str) else needle
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            found = self.output.find(wanted, start)
            if found >= 0:
                return found + len(wanted)
            if not self._read(0.1):
                break
        raise AssertionError(f"never saw {wanted!r}; the terminal got:\n"
                             f"{self.output[-3000:]!r}")

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def send(self, text: str, after: int = 0) -> int:
        """Type TEXT and Enter once a prompt came after offset AFTER; the offset from
        which its answer is read."""
        self.expect("you>", after)
        mark = self.mark()
        self.type(text.encode() + ENTER)
        return mark

    def wait_prompt(self, start: int) -> int:
        return self.expect("you>", start)

    def exit_code(self) -> int:
        """Wait (reading the terminal meanwhile) until the chat has exited."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                return code
            self._read(0.1)
        raise AssertionError(f"the chat did not exit; the terminal got:\n{self.output[-3000:]!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(DEADLINE)
        os.close(self.master)


@pytest.fixture
def chat(home):
    """Start chats on HOME (`chat(*args)`); each is stopped when the test ends."""
    started: list[PtyChat] = []

    def start(*args: str) -> PtyChat:
        started.append(PtyChat(home, *args))
        return started[-1]

    yield start
    for each in started:
        each.close()


def archive(home: Path) -> str:
    path = home / "memory" / "cli" / "local.org"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def script(path: Path, *entries: dict) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def cli_reply(text: str) -> str:
    return reply_action("cli", "local", text).printed()


def chunked(form: str, size: int, delay: float) -> dict:
    return {"chunks": [form[i:i + size] for i in range(0, len(form), size)], "delay": delay}


# -- typing -------------------------------------------------------------------------


def test_arrow_keys_edit_and_history_recalls_what_was_sent(chat, home):
    first = chat("--backend", "echo")
    first.expect("you>")
    mark = first.mark()
    first.type(b"hello wrld" + LEFT * 3 + b"o" + ENTER)
    mark = first.wait_prompt(first.expect("[Echo] hello world", mark))
    first.type(UP + ENTER)
    end = first.expect("[Echo] hello world", mark)
    first.wait_prompt(end)
    first.type(CTRL_D)
    assert first.exit_code() == 0

    again = chat("--backend", "echo")
    mark = again.expect("you>")
    again.type(UP + b"!" + ENTER)  # history survives the chat
    again.wait_prompt(again.expect("[Echo] hello world!", mark))
    again.type(CTRL_D)
    assert again.exit_code() == 0

    kept = archive(home)
    assert kept.count("[Echo] hello world\n") == 2 and "[Echo] hello world!" in kept
    assert "\x1b" not in kept and "^[" not in kept and "wrld" not in kept
    history = home / "chat-history"
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    lines = [line for line in history.read_text().splitlines() if line.startswith("+")]
    assert lines == ["+hello world", "+hello world!"]  # a repeat is kept once


def test_alt_enter_and_ctrl_j_make_one_message_with_its_newlines(chat, home):
    term = chat("--backend", "echo")
    mark = term.expect("you>")
    term.type(b"line one" + ALT_ENTER + b"line two" + CTRL_J + b"line three" + ENTER)
    term.expect("line three", term.expect("[Echo] line one", mark))
    term.type(CTRL_D)
    assert term.exit_code() == 0
    assert "\nline one\nline two\nline three\n" in archive(home)
    assert archive(home).count("[Echo] line one\nline two\nline three") == 1


def test_invalid_utf8_line_is_reported_and_the_chat_goes_on(chat, home):
    term = chat("--backend", "echo")
    mark = term.expect("you>")
    term.type(b"caf\xe9 au lait" + ENTER)
    mark = term.expect("not valid UTF-8", mark)
    term.wait_prompt(mark)
    term.type(b"still here" + ENTER)
    term.expect("[Echo] still here", mark)
    term.type(CTRL_D)
    assert term.exit_code() == 0
    assert "au lait" not in archive(home) and "still here" in archive(home)
    assert "au lait" not in (home / "chat-history").read_text(errors="replace")


def test_ctrl_d_leaves_and_ctrl_c_twice_leaves(chat):
    term = chat("--backend", "echo")
    term.expect("you>")
    term.type(CTRL_D)
    assert term.exit_code() == 0

    term = chat("--backend", "echo")
    mark = term.expect("you>")
    term.type(b"typed but not sent" + CTRL_C)  # clears the line, does not leave
    term.type(CTRL_C)
    term.wait_prompt(term.expect("Ctrl-C again or Ctrl-D leaves", mark))
    term.type(CTRL_C)
    assert term.exit_code() == 0
    assert b"[Echo]" not in term.output


# -- replies --------------------------------------------------------------------------


def test_reply_streams_after_a_thinking_indicator_and_shows_once(chat, home, tmp_path):
    words = " ".join(f"word{i}" for i in range(12))
    replies = script(tmp_path / "r.jsonl", chunked(cli_reply(words), 8, 0.25))
    term = chat("--script", str(replies))
    mark = term.send("talk slowly")
    thinking = term.expect("thinking", mark)
    first = term.expect("word0", thinking)
    assert b"word11" not in term.output, "the first words arrive before the turn ends"
    assert b"\x1b[K" in term.output[thinking:first], "the indicator is erased before the text"
    end = term.expect("word11", first)
    term.wait_prompt(end)
    assert term.output.count(words.encode()) == 1, "the verified reply is not printed again"
    assert b"thinking" not in term.output[first:]
    status = term.expect("turn 1", end)
    assert b"backend script" in term.output[end:status + 200]
    term.type(CTRL_D)
    assert term.exit_code() == 0
    assert words in archive(home)


def test_ctrl_c_aborts_a_slow_reply_and_the_chat_goes_on(chat, home, tmp_path):
    slow = chunked(cli_reply(" ".join(f"slow{i}" for i in range(200))), 6, 0.1)
    replies = script(tmp_path / "r.jsonl", slow, {"text": cli_reply("after the abort")})
    term = chat("--script", str(replies))
    mark = term.send("first message")
    mark = term.expect("slow1 ", mark)
    term.type(CTRL_C)
    mark = term.expect("Turn aborted", mark)
    assert b"slow199" not in term.output
    mark = term.wait_prompt(mark)
    term.type(b"second message" + ENTER)
    term.expect("after the abort", mark)
    term.type(CTRL_D)
    assert term.exit_code() == 0
    kept = archive(home)
    assert "second message" in kept and "after the abort" in kept
    assert "first message" not in kept and "slow1" not in kept


def test_a_rejected_preview_is_marked_and_the_retry_replaces_it(chat, home, tmp_path):
    bad = '(:type :request :target :nowhere :text "first try")'
    replies = script(tmp_path / "r.jsonl", {"text": bad}, {"text": cli_reply("second try")})
    term = chat("--script", str(replies))
    mark = term.send("hello")
    mark = term.expect("first try", mark)
    mark = term.expect(RETRYING, mark)
    end = term.expect("second try", mark)
    term.wait_prompt(end)
    term.type(CTRL_D)
    assert term.exit_code() == 0
    assert "second try" in archive(home) and "first try" not in archive(home)


def test_a_title_escape_in_a_reply_never_reaches_the_terminal(chat, home, tmp_path):
    hostile = "\x1b]0;pwned\x07hello\x1b[2Jthere\x9b31m"
    replies = script(tmp_path / "r.jsonl", chunked(cli_reply(hostile), 5, 0.0))
    term = chat("--script", str(replies))
    mark = term.send("hi")
    end = term.expect("there", term.expect("␛]0;pwned␇hello", mark))
    term.wait_prompt(end)
    term.type(CTRL_D)
    assert term.exit_code() == 0
    assert b"\x1b]0;" not in term.output and b"\x07" not in term.output
    assert b"\x1b[2J" not in term.output and "\x9b".encode() not in term.output
    assert "pwned" in archive(home) and "there" in archive(home)


def test_help_and_reload_are_answered_in_the_terminal(chat):
    term = chat("--backend", "echo")
    mark = term.send("/help")
    mark = term.expect("Alt-Enter", term.expect("/history", mark))
    mark = term.send("/reload", mark)
    mark = term.expect("reloaded", mark)
    term.send("/quit", mark)
    assert term.exit_code() == 0


# -- without a terminal -----------------------------------------------------------------


def test_piped_stdin_sends_one_message_a_line_and_skips_invalid_utf8(home):
    run = subprocess.run([sys.executable, "-m", "opencortex", "chat", "--backend", "echo",
                          "--home", str(home)], input=b"one\ncaf\xe9\n\ntwo\r\n",
                         capture_output=True, timeout=DEADLINE, env=cli_env(home))
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().splitlines() == ["[Echo] one", "[Echo] two"]
    assert b"input line 2 is not valid UTF-8" in run.stderr
    assert b"\x1b" not in run.stdout + run.stderr
    assert not (home / "chat-history").exists()


# -- the display, without a process ---------------------------------------------------


def test_a_delivered_reply_equal_to_the_preview_only_ends_the_line():
    out, err = io.StringIO(), io.StringIO()
    display = TerminalOutput(out, err, live=True, color=False)
    view = display.begin(thinking=True)
    view.on_chunk('(:type :request :target :cli :text "Hi \\"you\\"\x1b')
    view.on_chunk('")')
    view.on_reply_done()
    display.deliver('Hi "you"\x1b')
    display.deliver("Context compressed")
    display.end(view)
    assert out.getvalue() == 'thinking…\r\x1b[KHi "you"␛\nContext compressed\n'
    assert err.getvalue() == ""


def test_a_delivered_text_that_differs_from_the_preview_says_so():
    out, err = io.StringIO(), io.StringIO()
    display = TerminalOutput(out, err, live=True, color=False)
    view = display.begin(thinking=False)
    view.on_chunk('(:type :request :target :cli :text "draft")')
    display.deliver("System Error: rejected")
    display.end(view)
    assert out.getvalue() == "draft\nSystem Error: rejected\n"
    assert err.getvalue() == NOT_KEPT + "\n"


def test_an_error_replaces_the_thinking_indicator_on_its_line():
    out, err = io.StringIO(), io.StringIO()
    display = TerminalOutput(out, err, live=True, color=True)
    view = display.begin(thinking=True)
    display.deliver("System Error: LLM_UNAVAILABLE")
    display.end(view)
    assert out.getvalue() == "\x1b[2mthinking…\x1b[22m\r\x1b[KSystem Error: LLM_UNAVAILABLE\n"


def test_piped_output_shows_no_preview_and_no_indicator():
    out, err = io.StringIO(), io.StringIO()
    display = TerminalOutput(out, err, live=False, color=False)
    view = display.begin(thinking=True)
    view.on_chunk('(:type :request :target :cli :text "hi\x1b]0;x\x07")')
    view.on_reply_done()
    display.deliver("hi\x1b]0;x\x07")
    display.end(view)
    assert out.getvalue() == "hi␛]0;x␇\n" and err.getvalue() == ""


def test_a_reasoning_models_thinking_takes_the_indicators_place_dim_and_inert():
    out, err = io.StringIO(), io.StringIO()
    display = TerminalOutput(out, err, live=True, color=True)
    view = display.begin(thinking=True)
    view.on_thinking("Let me think\x1b[2J", True)
    view.on_thinking(" more.", False)
    view.on_chunk('(:type :request :target :cli :text "Hi")')
    view.on_reply_done()
    display.deliver("Hi")
    display.end(view)
    assert out.getvalue() == ("\x1b[2mthinking…\x1b[22m\r\x1b[K\x1b[2mLet me think␛[2J\x1b[22m"
                              "\x1b[2m more.\x1b[22m\nHi\n")
    assert err.getvalue() == ""


def test_thinking_is_not_shown_piped_or_when_turned_off():
    for live, shown in ((False, True), (True, False)):
        out, err = io.StringIO(), io.StringIO()
        display = TerminalOutput(out, err, live=live, color=False, thoughts=shown)
        view = display.begin(thinking=True)
        view.on_thinking("secret plans", True)
        view.on_chunk('(:type :request :target :cli :text "Hi")')
        view.on_reply_done()
        display.deliver("Hi")
        display.end(view)
        assert "secret" not in out.getvalue() + err.getvalue()
        assert out.getvalue().endswith("Hi\n")


def test_the_next_step_thinks_on_a_line_of_its_own_without_a_retry_notice():
    out, err = io.StringIO(), io.StringIO()
    display = TerminalOutput(out, err, live=True, color=False)
    view = display.begin(thinking=True)
    view.on_thinking("first step", True)
    view.on_reply_done()               # a tool call, say: no text to preview
    view.on_thinking("second step", True)
    view.on_chunk('(:type :request :target :cli :text "Done")')
    view.on_reply_done()
    display.deliver("Done")
    display.end(view)
    assert out.getvalue() == "thinking…\r\x1b[Kfirst step\nsecond step\nDone\n"
    assert err.getvalue() == ""


def test_status_line_names_every_figure():
    line = status_line({"turn": 3, "context-percent": 12.5, "cost-usd": 0.0012,
                        "cost-known": False, "latency-ms": 340.2, "backend": "echo",
                        "branch": "main", "session": "collapsed"})
    assert line == ("turn 3 · context 12.5% · cost ≥$0.0012 · latency 340 ms · "
                    "backend echo · branch main · session collapsed")
