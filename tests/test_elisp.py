"""The Emacs client in a real Emacs: byte-compilation with warnings as errors, and ERT.

`emacs --batch` (not -Q) finds Debian's elpa-epc through /etc/emacs/site-start.d,
the same way tests/run.sh checks for it.  The ERT tests tagged `kernel` drive the
real connection code against KERNEL_STAND_IN below: a python-epc server that
speaks the kernel's EPC methods (the end-to-end tests with the real kernel are
in their own file).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ELISP = REPO / "elisp"
ERT_FILE = REPO / "tests" / "elisp" / "opencortex-tests.el"
EMACS_TIMEOUT = 300

pytestmark = pytest.mark.skipif(shutil.which("emacs") is None,
                                reason="emacs is not installed (tests/run.sh installs it)")

KERNEL_STAND_IN = r'''
"""Speaks the kernel's EPC methods for the elisp tests; started as `... serve ARGS`."""
import json, os, secrets, sys, threading, time, uuid
from epc.server import ThreadingEPCServer

args = sys.argv[1:]
assert args[0] == "serve", args
home = args[args.index("--home") + 1]
connection_file = args[args.index("--connection-file") + 1] if "--connection-file" in args else None
refuse = "--refuse" in args
refused_marker = os.path.join(home, "refused")
if "--already-running" in args:  # as a kernel does when another one holds its home
    open(refused_marker, "w").close()
    print(f"a kernel is already running for {os.path.realpath(home)} (pid 1, EPC port 2); "
          "connect to it", file=sys.stderr)
    sys.exit(1)
secret = os.environ.pop("OPENCORTEX_SECRET", None) or secrets.token_hex(32)
server = ThreadingEPCServer(("127.0.0.1", 0))
turns = [0]
approvals = {}
branches = {"main": 0}
current = ["main"]


def emacs(method, *params):
    return server.clients[-1].call_sync(method, list(params), timeout=30)


def method(name):
    def register(function):
        server.register_function(function, name)
        return function
    return register


@method("authenticate")
def authenticate(given):
    if refuse or given != secret:
        raise ValueError("authentication failed")
    return True


def run_turn(turn_id, text):
    if text == "die":
        emacs("opencortex-stream", turn_id, "chunk", "partial reply")
        os._exit(3)
    reply = text
    if text == "approve":
        approval_id, answered = uuid.uuid4().hex, threading.Event()
        approvals[approval_id] = [answered, None]
        emacs("opencortex-ask-approval", approval_id,
              {"title": "Run a command", "action-class": "shell", "command": "echo hi",
               "argv": ["echo", "hi"], "cwd": home, "env": ["PATH"], "skill": "shell",
               "thread": "emacs:main", "model-note": "a test", "timeout": 30})
        answered.wait(30)
        reply = "ran" if approvals[approval_id][1] == "yes" else "denied"
    if text.startswith("stream "):
        pieces = [f"w{i} " for i in range(int(text.split()[1]))]
        final = "* Echo\n" + "".join(pieces) + "\n"
    else:
        final = f"* Echo\n{reply}\n"
        pieces = [final[i:i + 3] for i in range(0, len(final), 3)]
    for piece in pieces:
        emacs("opencortex-stream", turn_id, "chunk", piece)
    turns[0] += 1
    branches[current[0]] += 1
    emacs("opencortex-stream", turn_id, "end", final)


@method("send-message")
def send_message(chat_id, text):
    turn_id = uuid.uuid4().hex[:16]
    threading.Thread(target=run_turn, args=(turn_id, text), daemon=True).start()
    return {"turn-id": turn_id, "thread": f"emacs:{chat_id}"}


@method("answer-approval")
def answer_approval(approval_id, answer):
    entry = approvals.get(approval_id)
    if entry is None or entry[0].is_set():
        return False
    entry[1] = answer
    entry[0].set()
    return True


@method("status")
def status(chat_id):
    return {"turn": turns[0], "context-percent": 1.5, "cost-usd": 0.0, "latency-ms": 2.0,
            "backend": "fake", "warning": None, "branch": current[0], "unpriced-turns": 0,
            "memory-file": os.path.join(home, f"emacs-{chat_id}.org")}


@method("abort-turn")
def abort_turn(chat_id):
    return False


@method("slash-command")
def slash_command(chat_id, text):
    words = text.split()
    if words[0] == "/fork":
        name = f"fork-{len(branches)}"
        branches[name] = branches[current[0]]
        current[0] = name
        return {"text": f"Forked branch {name}; you are on it now."}
    if words[0] == "/switch":
        if words[1] not in branches:
            raise ValueError(f"no branch {words[1]}")
        current[0] = words[1]
        return {"text": f"Switched to branch {words[1]}."}
    return {"text": "fake help"}


@method("branches")
def list_branches(chat_id):
    return [{"name": name, "head_turn": turns, "turns": turns, "current": name == current[0]}
            for name, turns in branches.items()]


server.print_port()
if connection_file and "--file-after-refusal" in args:  # the race: file written after a refusal
    for _ in range(3000):
        if os.path.exists(refused_marker):
            break
        time.sleep(0.02)
if connection_file:
    descriptor = os.open(connection_file + ".tmp", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"port": server.server_address[1], "secret": secret, "pid": os.getpid(),
                   "home": os.path.realpath(home)}, handle)
    os.replace(connection_file + ".tmp", connection_file)
server.serve_forever()
'''


def emacs(*args: str, env: dict[str, str] | None = None,
          cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run a fresh `emacs --batch` with ARGS; bounded."""
    return subprocess.run(["emacs", "--batch", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=EMACS_TIMEOUT)


def run_ert(selector: str, env: dict[str, str]) -> str:
    """Run the ERT tests matching SELECTOR; assert all ran and passed; the summary line."""
    result = emacs("-L", str(ELISP), "-l", str(ERT_FILE),
                   "--eval", f"(ert-run-tests-batch-and-exit '{selector})", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    summary = re.search(r"^Ran (\d+) tests?, (\d+) results? as expected(.*)$", output, re.M)
    assert summary, output[-8000:]
    assert summary.group(1) == summary.group(2) != "0", summary.group(0)
    assert "skipped" not in summary.group(3) and "unexpected" not in summary.group(3).replace(
        "0 unexpected", ""), summary.group(0)
    return summary.group(0)


@pytest.mark.parametrize("name", sorted(p.name for p in ELISP.glob("*.el")))
def test_byte_compiles_without_warnings(name, tmp_path):
    for source in ELISP.glob("*.el"):
        shutil.copy(source, tmp_path / source.name)
    result = emacs("-L", str(tmp_path), "--eval", "(setq byte-compile-error-on-warn t)",
                   "-f", "batch-byte-compile", name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / name).with_suffix(".elc").exists()
    assert "Warning" not in result.stderr, result.stderr
    assert not list(ELISP.glob("*.elc")), "no .elc may be left in the tree"


def test_ert_buffer_logic():
    run_ert("(not (tag kernel))", dict(os.environ, OPENCORTEX_TEST_PYTHON=sys.executable))


def test_ert_with_kernel_stand_in(tmp_path):
    script = tmp_path / "kernel_stand_in.py"
    script.write_text(KERNEL_STAND_IN)
    env = {k: v for k, v in os.environ.items() if k != "OPENCORTEX_SECRET"}
    env.update(OPENCORTEX_TEST_FAKE_KERNEL=str(script), OPENCORTEX_TEST_PYTHON=sys.executable)
    run_ert("(tag kernel)", env)


def has_package_lint() -> bool:
    return emacs("--eval", "(require 'package-lint)").returncode == 0


CHECKDOC = r'''
(require 'checkdoc)
(let ((problems 0))
  (dolist (file command-line-args-left)
    (with-current-buffer (find-file-noselect file)
      (let ((checkdoc-autofix-flag 'never)
            (checkdoc-create-error-function
             (lambda (text start _end &optional _unfixable)
               (message "CHECKDOC %s:%d: %s" (file-name-nondirectory file)
                        (line-number-at-pos start) text)
               (setq problems (1+ problems))
               nil)))
        (checkdoc-current-buffer t))))
  (setq command-line-args-left nil)
  (kill-emacs (if (zerop problems) 0 1)))
'''

PACKAGE_LINT = r'''
(require 'package-lint)
(package-initialize)
;; No package archive is reachable here: the archive is what is installed
;; (Debian's elpa-epc), so the dependency checks still run against real data.
(dolist (installed package-alist)
  (unless (assq (car installed) package-archive-contents)
    (push installed package-archive-contents)))
(let ((package-lint-main-file (expand-file-name "opencortex.el"))
      (problems 0))
  (dolist (file (directory-files default-directory t "\\.el\\'"))
    (with-temp-buffer
      (insert-file-contents file t)
      (emacs-lisp-mode)
      (pcase-dolist (`(,line ,col ,type ,message) (package-lint-buffer))
        ;; package-lint 0.16 (Debian 12) predates Emacs 28.1 and calls any Emacs 28
        ;; requirement uninstallable; this very Emacs proves it wrong.
        (unless (and (string-prefix-p "This makes the package uninstallable" message)
                     (version<= "28.1" emacs-version))
          (message "LINT %s:%d:%d: %s: %s" (file-name-nondirectory file) line col type message)
          (setq problems (1+ problems))))))
  (kill-emacs (if (zerop problems) 0 1)))
'''


def run_driver(tmp_path: Path, driver: str, *args: str, cwd: Path = REPO,
               env: dict[str, str] | None = None,
               load_path: Path = ELISP) -> subprocess.CompletedProcess[str]:
    """Run the elisp DRIVER text in a fresh `emacs --batch`; ARGS follow it on the command line."""
    path = tmp_path / f"driver-{len(list(tmp_path.glob('driver-*.el')))}.el"
    path.write_text(driver, encoding="utf-8")
    return emacs("-L", str(load_path), "-l", str(path), *args, cwd=cwd, env=env)


def test_checkdoc_is_clean(tmp_path):
    result = run_driver(tmp_path, CHECKDOC, *sorted(map(str, ELISP.glob("*.el"))))
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "CHECKDOC" not in output, output


@pytest.mark.skipif(not has_package_lint() and not os.environ.get("CI"),   # CI: must run
                    reason="package-lint is not installed (Debian: elpa-package-lint)")
def test_package_lint_is_clean(tmp_path):
    result = run_driver(tmp_path, PACKAGE_LINT, cwd=ELISP)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "LINT" not in output, output


PACKAGE_INFO = r'''
(require 'package)
(require 'lisp-mnt)
(with-temp-buffer
  (insert-file-contents (expand-file-name "opencortex.el" (car command-line-args-left)))
  (emacs-lisp-mode)
  (let ((info (package-buffer-info)))
    (princ (format "NAME %s\nVERSION %S\nREQS %S\nSUMMARY %s\n"
                   (package-desc-name info) (package-desc-version info)
                   (package-desc-reqs info) (package-desc-summary info))))
  (dolist (header '("Author" "Maintainer" "URL" "Keywords"))
    (princ (format "%s %s\n" header (or (lm-header header) "")))))
(package-generate-autoloads "opencortex" (cadr command-line-args-left))
(setq command-line-args-left nil)
'''

AUTOLOADS = r'''
(load (car command-line-args-left) nil t)
(setq command-line-args-left nil)
(dolist (command '(opencortex-chat opencortex-connect))
  (unless (and (autoloadp (symbol-function command)) (commandp command))
    (error "%s is not an autoloaded command" command)))
(when (featurep 'opencortex) (error "opencortex was loaded before it was needed"))
(autoload-do-load (symbol-function 'opencortex-chat) 'opencortex-chat)
(unless (and (featurep 'opencortex) (fboundp 'opencortex-switch-branch))
  (error "the autoload did not load opencortex"))
(princ "AUTOLOADS OK\n")
'''


def test_package_header_and_autoloads(tmp_path):
    """The header is what package.el reads; M-x opencortex-chat works from the autoloads."""
    package = tmp_path / "opencortex-0.1.0"  # as package.el would install it
    package.mkdir()
    for source in ELISP.glob("*.el"):
        shutil.copy(source, package / source.name)
    result = run_driver(tmp_path, PACKAGE_INFO, str(ELISP), str(package))
    assert result.returncode == 0, result.stderr
    info = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert info["NAME"] == "opencortex"
    assert info["VERSION"] == "(0 1 0)"
    assert info["REQS"] == "((emacs (28 1)) (epc (0 1 1)))"
    assert info["SUMMARY"]
    for header in ("Author", "Maintainer", "URL", "Keywords"):
        assert info.get(header, "").strip(), header
    autoloads = package / "opencortex-autoloads.el"
    assert autoloads.exists()
    result = run_driver(tmp_path, AUTOLOADS, str(autoloads), load_path=package)
    assert result.returncode == 0 and "AUTOLOADS OK" in result.stdout, result.stderr


FIND_KERNEL = r'''
(require 'opencortex)
(setq opencortex-kernel-arguments (list "--home" (car command-line-args-left))
      command-line-args-left nil)
(opencortex-chat)
(let* ((ready (and (opencortex-wait-idle 30) (eq opencortex--kernel-state 'ready)))
       (process (opencortex-kernel-process))
       (command (and process (process-command process))))
  (princ (format "PID %s\nCOMMAND %s\nREADY %s\n"
                 (and process (process-id process)) (car command) ready))
  (opencortex-stop)
  (kill-emacs (if (and ready process (not (process-live-p process))) 0 1)))
'''


def test_chat_finds_the_checkouts_kernel_without_configuration(tmp_path):
    """M-x opencortex-chat with nothing set runs <checkout>/.venv/bin/opencortex, even with
    another opencortex on PATH."""
    checkout = tmp_path / "checkout"
    (checkout / "elisp").mkdir(parents=True)
    for source in ELISP.glob("*.el"):
        shutil.copy(source, checkout / "elisp" / source.name)
    stand_in = tmp_path / "kernel_stand_in.py"
    stand_in.write_text(KERNEL_STAND_IN)
    program = checkout / ".venv" / "bin" / "opencortex"
    program.parent.mkdir(parents=True)
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{stand_in}" "$@"\n')
    program.chmod(0o755)
    decoy = tmp_path / "path" / "opencortex"
    decoy.parent.mkdir()
    decoy.write_text("#!/bin/sh\nexit 7\n")
    decoy.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OPENCORTEX_SECRET"}
    env["PATH"] = f"{decoy.parent}{os.pathsep}{env.get('PATH', '')}"
    result = run_driver(tmp_path, FIND_KERNEL, str(home), env=env,
                        load_path=checkout / "elisp")
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    pid = lines.get("PID", "nil")
    if pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            pass
        else:
            os.kill(int(pid), 9)
            raise AssertionError("the kernel outlived its Emacs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines["COMMAND"] == str(program)
