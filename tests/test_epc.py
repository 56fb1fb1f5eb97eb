"""The kernel's EPC server, over real EPC with python-epc's client as the peer.

Emacs itself drives the kernel in test_emacs_e2e.py; here a Python EPC client
plays Emacs so each server rule can be checked directly.
"""

from __future__ import annotations

import json
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from epc.client import EPCClient

from opencortex.serve_port import default_connection_file

from conftest import cli_env


class Kernel:
    """`opencortex serve` as a subprocess; stopped by the test."""

    def __init__(self, home: Path, runtime: Path, *args: str, **env: str):
        self.runtime = runtime
        self.home = home
        self.process = subprocess.Popen(
            [sys.executable, "-m", "opencortex", "serve", "--home", str(home), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=cli_env(home, XDG_RUNTIME_DIR=str(runtime), **env))
        self.said = ""
        line = self.process.stdout.readline()
        assert line.strip().isdigit(), (line, self.process.stderr.read())
        self.port = int(line)

    @property
    def connection_file(self) -> Path:
        return default_connection_file(self.home, self.runtime / "opencortex")

    def secret(self) -> str:
        return json.loads(self.connection_file.read_text())["secret"]

    def stop(self) -> int:
        """SIGTERM, then its exit code; what it wrote on stderr is kept in `said` (for the
        message of a test that expected another code)."""
        self.process.terminate()
        try:
            return self.process.wait(timeout=30)   # turns in flight get [stop_grace] to finish
        finally:
            if self.process.poll() is None:
                self.process.kill()
            if not self.process.stderr.closed:          # stopped once already
                self.said = self.process.stderr.read()[-4000:]
            self.process.stdout.close()
            self.process.stderr.close()


class FakeEmacs:
    """A python-epc client that offers the elisp methods and records their calls."""

    def __init__(self, port: int):
        self.client = EPCClient(("127.0.0.1", port))
        self.calls: list[tuple[str, tuple]] = []
        self.lock = threading.Lock()
        for name in ("opencortex-insert", "opencortex-stream", "opencortex-show-error",
                     "opencortex-ask-approval", "opencortex-status-changed"):
            self.client.register_function(self._recorder(name), name)

    def _recorder(self, name: str):
        def record(*args):
            with self.lock:
                self.calls.append((name, args))
            return True
        return record

    def call(self, method: str, *args, timeout: float = 10):
        return self.client.call_sync(method, list(args), timeout=timeout)

    def wait_for(self, name: str, count: int = 1, timeout: float = 15) -> list[tuple]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [args for method, args in self.calls if method == name]
            if len(found) >= count:
                return found
            time.sleep(0.01)
        raise AssertionError(f"{name} called {len(found)} times, expected {count}: {self.calls}")

    def quiet(self, settle: float = 0.2, timeout: float = 10) -> None:
        """Wait until the kernel has made no call for SETTLE seconds (at most TIMEOUT)."""
        deadline = time.monotonic() + timeout
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            with self.lock:
                count = len(self.calls)
            if count != seen:
                seen, since = count, time.monotonic()
            elif time.monotonic() - since >= settle:
                return
            time.sleep(0.01)

    def close(self):
        try:   # end the reader with EOF: python-epc's reader fails on a file closed under it
            self.client.socket.shutdown(socket.SHUT_RD)     # (replies in flight still go)
        except OSError:
            pass
        reading = getattr(self.client.handler, "_recv_iter", None)
        if reading is not None:          # let it see the EOF before the file goes (bounded)
            reading.thread.join(timeout=5)
        self.client.close()


@pytest.fixture
def start(home, tmp_path):
    started: list[Kernel] = []
    clients: list[FakeEmacs] = []

    def launch(*args: str, authenticate: bool = True, **env: str):
        kernel = Kernel(home, tmp_path / "run", *args, **env)
        started.append(kernel)
        emacs = FakeEmacs(kernel.port)
        clients.append(emacs)
        if authenticate:
            assert emacs.call("authenticate", kernel.secret()) is True
        return kernel, emacs

    yield launch
    for client in clients:
        client.quiet()          # the kernel's calls in flight answered first, not into a closed pipe
        client.close()
    for kernel in started:
        kernel.stop()


def plist(items) -> dict:
    return {str(items[i]).lstrip(":"): items[i + 1] for i in range(0, len(items), 2)}


def test_port_first_connection_file_private_and_removed_on_exit(start):
    kernel, _ = start()
    info = json.loads(kernel.connection_file.read_text())
    assert info["port"] == kernel.port and info["pid"] == kernel.process.pid
    assert stat.S_IMODE(kernel.connection_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(kernel.connection_file.parent.stat().st_mode) == 0o700
    assert kernel.stop() == 0, kernel.said
    assert not kernel.connection_file.exists()


def test_calls_without_the_secret_are_refused_and_do_nothing(start, home):
    kernel, emacs = start(authenticate=False)
    with pytest.raises(Exception, match="not authenticated"):
        emacs.call("send-message", "main", "hello")
    with pytest.raises(Exception, match="not authenticated"):
        emacs.call("status", "main")
    with pytest.raises(Exception, match="authentication failed"):   # and the connection closes
        emacs.call("authenticate", "wrong secret")
    assert not (home / "memory" / "emacs").exists()


def test_a_secret_from_emacs_is_used_and_the_home_connection_file_names_the_kernel(start):
    kernel, emacs = start(authenticate=False, OPENCORTEX_SECRET="s3cret-from-emacs")
    assert emacs.call("authenticate", "s3cret-from-emacs") is True
    info = json.loads(kernel.connection_file.read_text())      # how a second Emacs finds it
    assert info["secret"] == "s3cret-from-emacs" and info["pid"] == kernel.process.pid
    assert stat.S_IMODE(kernel.connection_file.stat().st_mode) == 0o600


def test_the_port_listens_on_loopback_only(start):
    kernel, _ = start()
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout \
        if Path("/usr/bin/ss").exists() or Path("/bin/ss").exists() else ""
    for line in out.splitlines():
        if f":{kernel.port} " in line:
            assert "127.0.0.1:" in line, line
    addresses = set()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            addresses.add(probe.getsockname()[0])
    except OSError:
        pass
    for address in addresses - {"127.0.0.1", "0.0.0.0"}:
        with pytest.raises(OSError):
            socket.create_connection((address, kernel.port), timeout=2).close()


def finals(emacs: FakeEmacs) -> list[str]:
    """Verified replies: an "end" carrying text, or a plain insert."""
    with emacs.lock:
        return [args[2] if method == "opencortex-stream" else args[1]
                for method, args in emacs.calls
                if (method == "opencortex-stream" and args[1] == "end" and args[2])
                or method == "opencortex-insert"]


def wait_finals(emacs: FakeEmacs, count: int, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(finals(emacs)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return finals(emacs)


def test_send_message_acknowledges_then_streams_and_ends_with_the_verified_reply(start, home):
    kernel, emacs = start()
    ack = plist(emacs.call("send-message", "main", "héllo 🌍 世界"))
    assert ack["thread"] == "emacs:main" and ack["turn-id"]
    status = plist(emacs.wait_for("opencortex-status-changed")[0][0])
    assert status["turn"] == 1 and status["backend"] == "echo"
    assert status["turn-id"] == ack["turn-id"]
    streamed = emacs.wait_for("opencortex-stream", 2)
    chunks = "".join(a[2] for a in streamed if a[1] == "chunk")
    assert chunks == "* [Echo] héllo 🌍 世界"
    assert streamed[-1] == (ack["turn-id"], "end", "* [Echo] héllo 🌍 世界\n")
    assert all(a[0] == ack["turn-id"] for a in streamed)
    assert finals(emacs) == ["* [Echo] héllo 🌍 世界\n"]
    archive = (home / "memory" / "emacs" / "main.org").read_text()
    assert "héllo 🌍 世界" in archive


@pytest.mark.parametrize("choice, expected", [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_the_served_kernel_runs_on_the_chosen_event_loop_and_says_which(start, home, choice,
                                                                         expected):
    (home / "config.toml").write_text(f'event_loop = "{choice}"\n')
    kernel, emacs = start()
    emacs.call("send-message", "main", "/metrics")
    shown = wait_finals(emacs, 1)
    assert len(shown) == 1 and f"event loop: {expected}" in shown[0], shown


@pytest.mark.parametrize("in_a_process", [True, False])
def test_the_served_kernel_writes_files_in_a_child_process_and_says_so(start, home,
                                                                       in_a_process):
    (home / "config.toml").write_text(f"[memory]\nwrite_process = {str(in_a_process).lower()}\n")
    kernel, emacs = start(ANTHROPIC_API_KEY="sk-canary-served-writer")
    emacs.call("send-message", "main", "remember this")
    emacs.call("send-message", "main", "/metrics")
    shown = wait_finals(emacs, 2)
    assert len(shown) == 2, shown
    assert "remember this" in (home / "memory" / "emacs" / "main.org").read_text()
    found = re.search(r"archive writes: in a process of their own \(pid (\d+)\)", shown[1])
    if not in_a_process:
        assert found is None and "archive writes: in the writer thread" in shown[1], shown
        return
    assert found, shown
    child = int(found[1])
    stat_fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat_fields[1]) == kernel.process.pid           # the kernel's own child
    assert b"sk-canary" not in Path(f"/proc/{child}/environ").read_bytes()
    emacs.quiet()                        # no call of the kernel in flight, then
    emacs.close()                        # closed before the kernel goes (python-epc's reader)
    assert kernel.stop() == 0, kernel.said
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not Path(f"/proc/{child}").exists()                  # it ended with the kernel


def test_calls_are_handled_in_arrival_order(start, home):
    kernel, emacs = start()
    for i in range(20):
        emacs.client.call("send-message", ["main", f"message {i}"])
    assert wait_finals(emacs, 20, timeout=60) == [f"* [Echo] message {i}\n" for i in range(20)]


def test_an_invalid_message_gets_a_clear_error(start):
    kernel, emacs = start()
    with pytest.raises(Exception, match="text is blank"):
        emacs.call("send-message", "main", "   ")
    with pytest.raises(Exception, match="no such method"):
        emacs.call("eval", "(delete-file \"x\")")
    with pytest.raises(Exception, match="wrong number of arguments"):
        emacs.call("status")


def test_oversized_messages_are_refused_not_corrupted(start):
    kernel, emacs = start()
    big = "x" * (5 << 20)
    with pytest.raises(Exception, match="refused"):
        emacs.call("send-message", "main", big, timeout=30)
    assert plist(emacs.call("status", "main"))["turn"] == 0


def test_a_large_reply_is_split_under_the_cap(start, home):
    (home / "config.toml").write_text("max_reply_bytes = 2097152\n"
                                      "[emacs]\nmax_payload_bytes = 1100000\n")
    size = 1_000_000
    kernel, emacs = start()
    emacs.call("send-message", "main", "y" * size, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:         # the reply, not the notice of the
        pieces = [p for p in finals(emacs)       # compression it makes (its own insert)
                  if not p.startswith("Context compressed")]
        if sum(len(p) for p in pieces) >= size + len("* [Echo] \n"):
            break
        time.sleep(0.05)
    assert "".join(pieces) == "* [Echo] " + "y" * size + "\n"
    assert len(pieces) >= 2


def archived(path: Path, last: str, timeout: float = 10) -> str:
    """PATH's text once it holds LAST (a turn is archived just after it is shown)."""
    deadline = time.monotonic() + timeout
    text = ""
    while last not in text and time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        time.sleep(0.01)
    return text


def write_script(path: Path, *replies: str) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    return path


def test_approvals_approved_denied_and_timed_out(start, home, tmp_path):
    """A command is a step of the tool loop: asked about in Emacs, run on yes, and its
    result (or the denial) goes back to the model, which then answers."""
    work = tmp_path / "work"
    work.mkdir()
    (home / "config.toml").write_text(
        f'[shell]\ncwd = "{work}"\n[emacs]\napproval_timeout = 1.5\n')
    replies = [reply for name in ("approved", "denied", "timedout") for reply in (
        f'(:type :REQUEST :target :shell :cmd ("touch" "{name}") :reason "demo")',
        f'(:type :RESPONSE :text "* after {name}")')]
    script = write_script(tmp_path / "r.jsonl", *replies)
    kernel, emacs = start("--script", str(script), ANTHROPIC_API_KEY="sk-test-never-shown")
    emacs.call("send-message", "main", "one")
    approval_id, shown = emacs.wait_for("opencortex-ask-approval")[0]
    shown = plist(shown)
    assert shown["argv"] == ["touch", "approved"] and shown["cwd"] == str(work)
    assert shown["model-note"] == "demo" and "reason" not in shown
    assert shown["title"] == "Run a command" and shown["action-class"] == "shell"
    assert shown["skill"] == "chat" and "PATH" in shown["env"]
    assert emacs.call("answer-approval", approval_id, "yes") is True
    assert [text.rstrip("\n") for text in wait_finals(emacs, 2)[:2]] == [
        "⚙ step 1: shell touch approved → done", "* after approved"]
    emacs.call("send-message", "main", "two")
    approval_id = emacs.wait_for("opencortex-ask-approval", 2)[1][0]
    assert emacs.call("answer-approval", approval_id, "no") is True
    assert wait_finals(emacs, 4)[2].startswith("⚙ step 1: shell touch denied → not approved")
    emacs.call("send-message", "main", "three")
    emacs.wait_for("opencortex-ask-approval", 3)
    assert wait_finals(emacs, 6)[4].startswith("⚙ step 1: shell touch timedout → not approved")
    assert sorted(p.name for p in work.iterdir()) == ["approved"]
    assert emacs.call("answer-approval", approval_id, "yes") in (False, [])
    archive = archived(home / "memory" / "emacs" / "main.org", "after timedout")
    assert "exit 0" in archive                          # the command's result, archived
    assert "denied by the owner" in archive
    assert "the owner did not answer in time" in archive


def test_approved_command_runs_without_secrets_in_its_environment(start, home, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (home / "config.toml").write_text(f'[shell]\ncwd = "{work}"\n')
    script = write_script(tmp_path / "r.jsonl", '(:type :REQUEST :target :shell :cmd "env")',
                          '(:type :RESPONSE :text "* ran")')
    kernel, emacs = start("--script", str(script), ANTHROPIC_API_KEY="sk-test-never-shown",
                          MY_SECRET_TOKEN="hidden")
    emacs.call("send-message", "main", "show env")
    approval_id = emacs.wait_for("opencortex-ask-approval")[0][0]
    emacs.call("answer-approval", approval_id, "yes")
    wait_finals(emacs, 2)
    output = archived(home / "memory" / "emacs" / "main.org", "* ran")   # the step's result
    assert "PATH=" in output
    assert "sk-test-never-shown" not in output and "hidden" not in output
    assert "OPENCORTEX_SECRET" not in output


def test_abort_turn_stops_a_slow_turn_and_archives_nothing(start, home, tmp_path):
    script = tmp_path / "slow.jsonl"
    script.write_text(json.dumps({"delay": 0.02, "chunks": ['(:type :REQUEST :target :emacs ',
                                             ':action :insert-at-end :buffer "*opencortex-chat*" ',
                                             ':text "* slow'] + [" word"] * 400 + ['")']}) + "\n")
    (home / "config.toml").write_text("")
    kernel, emacs = start("--script", str(script))
    emacs.call("send-message", "main", "go slowly")
    emacs.wait_for("opencortex-stream")
    assert emacs.call("abort-turn", "main") is True
    aborted = [a for a in emacs.wait_for("opencortex-stream", 2, timeout=20) if a[1] == "abort"]
    deadline = time.monotonic() + 10
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.05)
        aborted = [a for m, a in list(emacs.calls) if m == "opencortex-stream" and a[1] == "abort"]
    assert aborted and "aborted" in aborted[0][2]
    assert not (home / "memory" / "emacs" / "main.org").exists()
    assert emacs.call("abort-turn", "main") in (False, [])


def test_messages_beyond_max_waiting_turns_are_refused_with_the_reason(start, home, tmp_path):
    """A client sending faster than turns end gets an error, not a growing queue."""
    insert = '(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*opencortex-chat*" '
    slow = {"delay": 0.02, "chunks": [insert, ':text "* slow'] + [" word"] * 500 + ['")']}
    script = tmp_path / "replies.jsonl"
    script.write_text("\n".join([json.dumps(slow)] + [json.dumps(f'{insert}:text "* {n}")')
                                                        for n in ("two", "three", "four")]))
    (home / "config.toml").write_text("[emacs]\nmax_waiting_turns = 3\n")
    kernel, emacs = start("--script", str(script))
    for n in range(3):
        emacs.call("send-message", "main", f"message {n}")
    with pytest.raises(Exception, match="3 messages are waiting for their replies already"):
        emacs.call("send-message", "other", "one too many")      # over every chat
    emacs.wait_for("opencortex-stream")          # the slow reply streams: its turn has it
    assert emacs.call("abort-turn", "main") is True
    assert wait_finals(emacs, 2) == ["* two\n", "* three\n"]
    emacs.call("send-message", "main", "room again")
    assert wait_finals(emacs, 3)[-1] == "* four\n"


def test_a_compression_notice_after_a_streamed_reply_is_shown(start, home):
    (home / "config.toml").write_text("[conversation]\nbudget = 300\nthreshold = 0.8\n"
                                      "target = 0.5\n")
    kernel, emacs = start()
    for i in range(12):
        emacs.call("send-message", "main", f"message {i} with enough words to fill the budget")
    shown = wait_finals(emacs, 13, timeout=60)
    assert any(text.startswith("Context compressed") for text in shown), shown
    with emacs.lock:
        ends = [args[0] for method, args in emacs.calls
                if method == "opencortex-stream" and args[1] == "end"]
        notices = [args[1] for method, args in emacs.calls
                   if method == "opencortex-insert" and args[1].startswith("Context compressed")]
    assert len(ends) == len(set(ends)), "a turn is ended once; Emacs ignores a second end"
    assert notices, "the notice comes as an insert of its own"
    replies = [args[2] for method, args in list(emacs.calls)
               if method == "opencortex-stream" and args[1] == "end" and args[2]]
    assert len(replies) == 12, "each verified reply takes the place of its own preview"
