"""End to end: a real `emacs --batch` starts the real kernel itself and chats over EPC.

Each test writes a small elisp driver, runs it in a fresh Emacs (bounded), and
checks what the chat buffer showed and what the org archive kept.  The driver
stops the kernel before Emacs exits; the test checks the process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env

REPO = Path(__file__).resolve().parents[1]
ELISP = REPO / "elisp"

pytestmark = pytest.mark.skipif(shutil.which("emacs") is None,
                                reason="emacs is not installed (tests/run.sh installs it)")


def lisp(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


PRELUDE = """
(require 'opencortex)
(setq opencortex-program (list {python} "-m" "opencortex")
      opencortex-kernel-arguments (list "--home" {home} {extra})
      opencortex-wait-timeout 60)
(defun e2e-fail (message)
  (message "E2E-FAIL %s" message)
  (e2e-dump)
  (ignore-errors (opencortex-stop))
  (kill-emacs 2))
(defun e2e-dump ()
  (with-current-buffer "*opencortex-chat*"
    (let ((coding-system-for-write 'utf-8))
      (write-region (point-min) (point-max) {out} nil 'silent))))
(defun e2e-buffer-text ()
  (with-current-buffer "*opencortex-chat*"
    (buffer-substring-no-properties (point-min) (point-max))))
(defun e2e-contains (text)
  (string-search text (e2e-buffer-text)))
(defun e2e-send (text)
  (opencortex-send text)
  (unless (opencortex-wait-idle 60) (e2e-fail (format "no answer to %S" text))))
(defun e2e-finish ()
  (e2e-dump)
  (let ((process (opencortex-kernel-process)))
    (with-temp-file {pidfile} (insert (format "%s" (and process (process-id process)))))
    (opencortex-stop)
    (when (and process (process-live-p process)) (e2e-fail "kernel still running")))
  (kill-emacs 0))
(opencortex-chat)
(unless (opencortex-wait-idle 60) (e2e-fail "the kernel did not start"))
"""


def gone(pid: int, seconds: float) -> bool:
    """Whether process PID ends within SECONDS."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


class Driver:
    def __init__(self, tmp_path: Path, home: Path, extra_args: tuple[str, ...] = ()):
        self.tmp = tmp_path
        self.home = home
        self.out = tmp_path / "buffer.org"
        self.pidfile = tmp_path / "kernel.pid"
        self.extra = " ".join(lisp(a) for a in extra_args)

    def run(self, body: str, timeout: float = 240) -> str:
        driver = self.tmp / "driver.el"
        driver.write_text(PRELUDE.format(
            python=lisp(sys.executable), home=lisp(str(self.home)), extra=self.extra,
            out=lisp(str(self.out)), pidfile=lisp(str(self.pidfile))) + body + "\n(e2e-finish)\n",
            encoding="utf-8")
        env = cli_env(self.home, XDG_RUNTIME_DIR=str(self.tmp / "run"))
        result = subprocess.run(["emacs", "--batch", "-L", str(ELISP), "-l", str(driver)],
                                capture_output=True, text=True, timeout=timeout, env=env)
        self.check_kernel_stopped()
        buffer = self.out.read_text(encoding="utf-8") if self.out.exists() else ""
        assert result.returncode == 0, (result.stderr[-6000:], buffer[-3000:])
        return buffer

    def check_kernel_stopped(self) -> None:
        if not self.pidfile.exists() or not self.pidfile.read_text().strip().isdigit():
            return
        pid = int(self.pidfile.read_text())
        if not gone(pid, 10):
            os.kill(pid, 9)
            raise AssertionError(f"kernel {pid} outlived the test")

    def archive(self) -> str:
        path = self.home / "memory" / "emacs" / "main.org"
        return path.read_text(encoding="utf-8") if path.exists() else ""


def script(path: Path, *entries) -> Path:
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries),
                    encoding="utf-8")
    return path


def emacs_reply(text: str, chunk: int = 0) -> dict:
    form = ('(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*opencortex-chat*" '
            f':text {lisp(text)})')
    if not chunk:
        return {"text": form}
    return {"chunks": [form[i:i + chunk] for i in range(0, len(form), chunk)]}


def test_a_message_from_the_buffer_gets_the_echo_reply_and_is_archived(tmp_path, home):
    driver = Driver(tmp_path, home)
    buffer = driver.run("""
(e2e-send "hello from emacs")
(unless (e2e-contains "* [Echo] hello from emacs") (e2e-fail "no echo reply"))
""")
    assert buffer.count("* [Echo] hello from emacs\n") == 1
    assert "hello from emacs" in buffer.split("* [Echo]")[0]
    archive = driver.archive()
    assert "\nhello from emacs\n" in archive
    assert "[Echo] hello from emacs" in archive


def test_many_chunks_unicode_and_a_megabyte_arrive_whole_and_in_order(tmp_path, home):
    words = " ".join(f"w{i}" for i in range(600))
    unicode = "Emoji 🌍👩‍💻 and CJK 世界你好 and quotes \" \\ done"
    big = "* Big\n" + ("0123456789abcdef" * 64 + "\n") * 1000
    replies = script(tmp_path / "replies.jsonl", emacs_reply(f"* Words\n{words}", chunk=3),
                     emacs_reply(f"* Unicode\n{unicode}", chunk=2), emacs_reply(big, chunk=4096))
    (home / "config.toml").write_text("max_reply_bytes = 4194304\n")
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    buffer = driver.run("""
(e2e-send "words please")
(e2e-send "unicode please")
(e2e-send "a megabyte please")
""")
    assert buffer.count(f"* Words\n{words}") == 1
    assert buffer.count(f"* Unicode\n{unicode}") == 1
    assert buffer.count(big.rstrip("\n")) == 1
    assert buffer.index("* Words") < buffer.index("* Unicode") < buffer.index("* Big")
    archive = driver.archive()
    assert unicode in archive and words in archive


def test_kernel_killed_mid_stream_shows_the_error_then_restarts_without_duplicates(
        tmp_path, home):
    slow = emacs_reply("* Slow\n" + " ".join(f"s{i}" for i in range(300)), chunk=4)
    slow["delay"] = 0.02
    replies = script(tmp_path / "replies.jsonl", slow)
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    fast = json.dumps(emacs_reply("* After restart\nfine"))
    buffer = driver.run(f"""
(opencortex-send "first")
(unless (opencortex-wait-for (lambda () (e2e-contains "s1 ")) 30) (e2e-fail "no streaming"))
(with-temp-file {lisp(str(replies))} (insert {lisp(fast)} "\\n"))
(signal-process (process-id (opencortex-kernel-process)) 'KILL)
(unless (opencortex-wait-for (lambda () (e2e-contains "Error")) 30) (e2e-fail "no error shown"))
(unless (opencortex-wait-idle 60) (e2e-fail "no restart"))
(e2e-send "second")
(unless (e2e-contains "* After restart") (e2e-fail "no reply after restart"))
""")
    assert "Error" in buffer
    assert "s1 " not in buffer, "the partial stream of the dead kernel must be gone"
    assert buffer.count("* After restart\nfine") == 1
    archive = driver.archive()
    assert "\nsecond\n" in archive and "\nfirst\n" not in archive
    assert "s1 s2" not in archive


def test_the_prompt_stays_a_heading_while_a_reply_streams(tmp_path, home):
    """The streamed preview ends mid-line; it must never run into the prompt line."""
    slow = emacs_reply("* Slow\n" + " ".join(f"s{i}" for i in range(200)), chunk=4)
    slow["delay"] = 0.01
    replies = script(tmp_path / "replies.jsonl", slow)
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    buffer = driver.run("""
(defun e2e-prompt-is-a-heading ()
  (with-current-buffer "*opencortex-chat*"
    (save-excursion
      (goto-char opencortex--input-marker)
      (forward-line -1)
      (and (looking-at-p (regexp-quote opencortex-prompt)) (org-at-heading-p)))))
(opencortex-send "go slowly")
(unless (opencortex-wait-for (lambda () (e2e-contains "s1 ")) 30) (e2e-fail "no streaming"))
(when (e2e-contains "s199") (e2e-fail "the reply ended before it could be checked mid-stream"))
(unless (e2e-prompt-is-a-heading) (e2e-fail "the streamed preview ran into the prompt"))
(unless (opencortex-wait-idle 60) (e2e-fail "the turn did not end"))
(unless (e2e-prompt-is-a-heading) (e2e-fail "the prompt is not a heading after the reply"))
""")
    assert buffer.count("* Slow\n") == 1
    assert buffer.endswith("s199\n* Message  (C-c RET sends, C-c C-k aborts)\n")


def test_fork_rewind_and_switch_branch_from_emacs(tmp_path, home):
    """The branch commands reach the real kernel; the switch offers its real branches."""
    driver = Driver(tmp_path, home)
    buffer = driver.run("""
(defun e2e-branch () (plist-get opencortex--status :branch))
(e2e-send "first on main")
(e2e-send "second on main")
(opencortex-fork)
(unless (opencortex-wait-idle 60) (e2e-fail "/fork did not answer"))
(let ((fork (e2e-branch)) offered)
  (when (or (null fork) (equal fork "main")) (e2e-fail (format "after /fork on %S" fork)))
  (e2e-send "third on the fork")
  (cl-letf (((symbol-function 'completing-read)
             (lambda (_prompt collection &rest _) (setq offered collection) "main")))
    (call-interactively #'opencortex-switch-branch))
  (unless (equal (sort (copy-sequence offered) #'string<) (sort (list fork "main") #'string<))
    (e2e-fail (format "offered %S" offered)))
  (unless (equal (car offered) fork) (e2e-fail "the current branch is not offered first"))
  (unless (opencortex-wait-idle 60) (e2e-fail "/switch did not answer"))
  (unless (equal (e2e-branch) "main") (e2e-fail (format "after /switch on %S" (e2e-branch))))
  (unless (string-search "| branch main |" (opencortex--header-line))
    (e2e-fail (format "header %S" (opencortex--header-line))))
  (unless (eql (plist-get opencortex--status :turn) 2) (e2e-fail "main lost a turn"))
  (opencortex-rewind 1)
  (unless (opencortex-wait-idle 60) (e2e-fail "/rewind did not answer"))
  (unless (eql (plist-get opencortex--status :turn) 1) (e2e-fail "/rewind did not rewind")))
""")
    assert "* /fork\n" in buffer and "* /switch main\n" in buffer and "* /rewind 1\n" in buffer
    assert "Error" not in buffer


def test_approvals_only_the_approved_command_runs(tmp_path, home):
    """Each command is a step of its turn: asked about in Emacs, run only on yes; the
    person sees one line per step, the model its result, then the model answers."""
    work = tmp_path / "work"
    work.mkdir()
    (home / "config.toml").write_text(
        f'[shell]\ncwd = "{work}"\n[emacs]\napproval_timeout = 2\n')
    replies = script(tmp_path / "replies.jsonl", *[{"text": text} for name in (
        "yes-file", "no-file", "late-file") for text in (
        f'(:type :REQUEST :target :shell :cmd ("touch" "{name}") :reason "test {name}")',
        f'(:type :RESPONSE :text "* after {name}")')])
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    buffer = driver.run("""
(defun e2e-approval ()
  (unless (opencortex-wait-for #'opencortex-pending-approvals 30) (e2e-fail "no approval")))
(opencortex-send "one") (e2e-approval) (opencortex-approve)
(unless (opencortex-wait-idle 60) (e2e-fail "approved turn did not end"))
(opencortex-send "two") (e2e-approval) (opencortex-deny)
(unless (opencortex-wait-idle 60) (e2e-fail "denied turn did not end"))
(opencortex-send "three") (e2e-approval)
(unless (opencortex-wait-idle 60) (e2e-fail "timed-out turn did not end"))
""")
    assert sorted(p.name for p in work.iterdir()) == ["yes-file"]
    assert "⚙ step 1: shell touch yes-file → done" in buffer
    assert "⚙ step 1: shell touch no-file → not approved" in buffer
    assert "⚙ step 1: shell touch late-file → not approved" in buffer
    assert all(f"* after {name}" in buffer for name in ("yes-file", "no-file", "late-file"))
    archive = driver.archive()          # each step's result, as the model was told it
    assert "Shell: touch yes-file (exit 0)" in archive
    assert archive.count(":STEP_OUTCOME: done") == 2             # the call and its result
    assert archive.count(":STEP_OUTCOME: not approved") == 4
    assert "denied by the owner" in archive and "the owner did not answer in time" in archive


def test_a_rejected_reply_shows_a_system_error_in_the_buffer(tmp_path, home):
    bad = {"text": '(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*scratch*" '
                   ':text "sneaky")'}
    replies = script(tmp_path / "replies.jsonl", bad, bad)
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    buffer = driver.run("""
(e2e-send "try it")
""")
    assert "System Error: Chat agent returned invalid action" in buffer
    assert "sneaky" not in buffer.split("System Error")[0]


def test_emacs_exits_when_its_terminal_hangs_up_and_the_kernel_stops(tmp_path, home):
    """A terminal Emacs whose tty goes away (a closed ssh session) must exit, and so must
    its kernel: waiting for process output at exit would spin forever on a dead tty."""
    import pty
    import select
    pidfile = tmp_path / "kernel.pid"
    startup = tmp_path / "start.el"
    startup.write_text(f"""
(require 'opencortex)
(setq opencortex-program (list {lisp(sys.executable)} "-m" "opencortex")
      opencortex-kernel-arguments (list "--home" {lisp(str(home))}))
(opencortex-chat)
(run-with-timer 0.2 0.2
  (lambda ()
    (let ((process (opencortex-kernel-process)))
      (when (and process (eq opencortex--kernel-state 'ready))
        (with-temp-file {lisp(str(pidfile))} (insert (format "%d" (process-id process))))))))
""")
    env = cli_env(home, XDG_RUNTIME_DIR=str(tmp_path / "run"), TERM="xterm")
    child, master = pty.fork()
    if child == 0:  # pragma: no cover - the child becomes Emacs
        os.execvpe("emacs", ["emacs", "-nw", "-L", str(ELISP), "-l", str(startup)], env)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    os.read(master, 65536)  # keep the terminal drained
                except OSError:
                    break
        assert pidfile.exists(), "the kernel never came up"
        kernel = int(pidfile.read_text())
        os.close(master)  # the terminal hangs up
        master = -1
        deadline = time.monotonic() + 20
        exited = False
        while time.monotonic() < deadline and not exited:
            exited = os.waitpid(child, os.WNOHANG)[0] == child
            time.sleep(0.05)
        assert exited, "Emacs kept running after its terminal went away"
        assert gone(kernel, max(0.0, deadline - time.monotonic())), \
            "the kernel outlived its Emacs"
    finally:
        if master != -1:
            os.close(master)
        for pid in (child, int(pidfile.read_text()) if pidfile.exists() else None):
            try:
                if pid:
                    os.kill(pid, 9)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(child, 0)
        except ChildProcessError:
            pass


# Exactly one kernel per home: Emacs joins the kernel already running for its home.

JOIN = """
(require 'opencortex)
(setq opencortex-program (list {wrapper})
      opencortex-home {home}
      opencortex-kernel-arguments nil
      opencortex-wait-timeout 60)
(defun e2e-fail (message)
  (message "E2E-FAIL %s" message)
  (e2e-dump)
  (kill-emacs 2))
(defun e2e-dump ()
  (with-current-buffer "*opencortex-chat*"
    (let ((coding-system-for-write 'utf-8))
      (write-region (point-min) (point-max) {out} nil 'silent))))
(opencortex-chat)
(unless (opencortex-wait-idle 60) (e2e-fail "no connection"))
(unless (eq opencortex--kernel-state 'ready) (e2e-fail (format "state %s" opencortex--kernel-state)))
(when (opencortex-kernel-process) (e2e-fail "Emacs runs a kernel of its own"))
(opencortex-send "hello to the running kernel")
(unless (opencortex-wait-idle 60) (e2e-fail "no answer"))
(e2e-dump)
(opencortex-stop)
(kill-emacs 0)
"""


def connection_file(runtime: Path, home: Path) -> Path:
    """The kernel's connection file for HOME, computed as the issue specifies it."""
    import hashlib
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
    return runtime / "opencortex" / f"kernel-{digest}.json"


class KernelOnItsOwn:
    """`opencortex serve --home HOME` started from a shell (no $OPENCORTEX_SECRET)."""

    def __init__(self, tmp_path: Path, home: Path, runtime: Path):
        env = cli_env(home, XDG_RUNTIME_DIR=str(runtime))
        env.pop("OPENCORTEX_SECRET", None)
        self.stderr = (tmp_path / "kernel.err").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "opencortex", "serve", "--home", str(home)], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.file = connection_file(runtime, home)

    def wait_ready(self) -> None:
        import select
        deadline = time.monotonic() + 60
        while not select.select([self.process.stdout], [], [], 0.05)[0]:
            assert self.process.poll() is None and time.monotonic() < deadline, \
                "the kernel printed no port"
        assert self.process.stdout.readline().strip().isdigit()
        while not self.file.exists():
            assert time.monotonic() < deadline, f"no connection file {self.file}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process.stdout.close()
        self.stderr.close()


def join_driver(tmp_path: Path, home_for_emacs: str) -> tuple[Path, Path, Path]:
    """The elisp driver, the wrapper Emacs would start a kernel with, and its log."""
    log = tmp_path / "starts.log"
    wrapper = tmp_path / "opencortex-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> "{log}"\n'
                       f'exec "{sys.executable}" -m opencortex "$@"\n')
    wrapper.chmod(0o755)
    out = tmp_path / "buffer.org"
    driver = tmp_path / "join.el"
    driver.write_text(JOIN.format(wrapper=lisp(str(wrapper)), home=lisp(home_for_emacs),
                                  out=lisp(str(out))), encoding="utf-8")
    return driver, log, out


def check_joined(kernel: KernelOnItsOwn, home: Path, buffer: str) -> None:
    """Emacs's turn went to KERNEL, which still runs and still holds the home."""
    assert buffer.count("* [Echo] hello to the running kernel\n") == 1, buffer
    assert "Error" not in buffer, buffer
    archive = (home / "memory" / "emacs" / "main.org").read_text(encoding="utf-8")
    assert "\nhello to the running kernel\n" in archive
    assert "[Echo] hello to the running kernel" in archive
    assert kernel.process.poll() is None, "the kernel stopped with Emacs"
    assert json.loads((home / "kernel.lock").read_text())["pid"] == kernel.process.pid


def test_chat_connects_to_the_kernel_already_running_for_its_home(tmp_path, home):
    """`opencortex serve` runs for HOME; M-x opencortex-chat with `opencortex-home` naming
    HOME (through a symbolic link, with a trailing slash) connects to it, starts no second
    kernel, and leaves it running when Emacs quits."""
    runtime = tmp_path / "run"
    link = tmp_path / "link-to-home"
    link.symlink_to(home)
    kernel = KernelOnItsOwn(tmp_path, home, runtime)
    try:
        kernel.wait_ready()
        driver, log, out = join_driver(tmp_path, f"{link}/")
        env = cli_env(tmp_path / "not-this-home", XDG_RUNTIME_DIR=str(runtime))
        result = subprocess.run(["emacs", "--batch", "-L", str(ELISP), "-l", str(driver)],
                                capture_output=True, text=True, timeout=240, env=env)
        buffer = out.read_text(encoding="utf-8") if out.exists() else ""
        assert result.returncode == 0, (result.stderr[-6000:], buffer[-3000:])
        assert not log.exists(), "Emacs started a kernel of its own"
        check_joined(kernel, home, buffer)
        assert not (tmp_path / "not-this-home").exists()
    finally:
        kernel.stop()
    assert kernel.process.returncode == 0
    assert not kernel.file.exists(), "the kernel left its connection file behind"


def test_chat_whose_kernel_start_is_refused_connects_to_the_running_one(tmp_path, home):
    """The race: Emacs finds no connection file and starts a kernel, which the running
    kernel's lock refuses; Emacs then connects to the running kernel once its file is
    there, instead of failing or starting yet another."""
    runtime = tmp_path / "run"
    kernel = KernelOnItsOwn(tmp_path, home, runtime)
    hidden = tmp_path / "hidden-connection-file.json"
    emacs = None
    try:
        kernel.wait_ready()
        kernel.file.rename(hidden)  # as if the running kernel had not written it yet
        driver, log, out = join_driver(tmp_path, str(home))
        env = cli_env(home, XDG_RUNTIME_DIR=str(runtime))
        emacs = subprocess.Popen(["emacs", "--batch", "-L", str(ELISP), "-l", str(driver)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while not log.exists() and emacs.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.exists(), "Emacs did not try to start a kernel"
        hidden.rename(kernel.file)
        stdout, stderr = emacs.communicate(timeout=240)
        buffer = out.read_text(encoding="utf-8") if out.exists() else ""
        assert emacs.returncode == 0, (stderr[-6000:], buffer[-3000:])
        assert len(log.read_text().split()) == 1, "Emacs started more than one kernel"
        check_joined(kernel, home, buffer)
    finally:
        if emacs is not None and emacs.poll() is None:
            emacs.kill()
            emacs.communicate(timeout=30)
        if hidden.exists():
            hidden.rename(kernel.file)
        kernel.stop()


def test_a_reply_emacs_refuses_is_archived_with_a_mark_that_it_was_not_delivered(
        tmp_path, home):
    """The reply goes to an allowed buffer the person made read-only: Emacs refuses the
    insert over EPC, the chat buffer says so, and the archive keeps the reply followed by
    its delivery mark."""
    (home / "config.toml").write_text('[chat]\nallowed_buffers = ["*notes*"]\n')
    reply = {"text": '(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*notes*" '
                     ':text "a note nobody reads")'}
    replies = script(tmp_path / "replies.jsonl", reply)
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    buffer = driver.run("""
(with-current-buffer (get-buffer-create "*notes*") (setq buffer-read-only t))
(e2e-send "note this")
(with-current-buffer "*notes*"
  (unless (= (buffer-size) 0) (e2e-fail "the read-only buffer changed")))
""")
    assert "System Error: the reply to *notes* on emacs was not delivered (Emacs did not " \
        "take opencortex-insert: Emacs: Buffer *notes* is read-only)" in buffer
    assert "a note nobody reads" not in buffer
    archive = driver.archive()
    reply_at = archive.index("\na note nobody reads\n")
    mark = archive[reply_at:]
    assert ":CONTROL:  delivery" in mark and ":DELIVERY: failed" in mark
    assert "Not delivered: Emacs did not take opencortex-insert: Emacs: Buffer *notes* is " \
        "read-only" in mark
    reply_id = archive[:reply_at].rsplit(":ID:", 1)[1].split()[0]
    assert f":TARGET:   {reply_id}" in mark


def test_a_streamed_reply_for_another_buffer_goes_there_not_into_the_chat(tmp_path, home):
    (home / "config.toml").write_text('[chat]\nallowed_buffers = ["*notes*"]\n')
    form = ('(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*notes*" '
            ':text "milk, eggs, bread")')
    replies = script(tmp_path / "replies.jsonl", {"chunks": [form[:40], form[40:]]})
    driver = Driver(tmp_path, home, ("--script", str(replies)))
    buffer = driver.run("""
(e2e-send "note the shopping")
(with-current-buffer "*notes*"
  (unless (string-search "milk, eggs, bread" (buffer-string))
    (e2e-fail "the note is not in *notes*")))
""")
    assert "milk, eggs, bread" not in buffer and "System Error" not in buffer
