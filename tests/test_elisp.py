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
import json, os, secrets, sys, threading, uuid
from epc.server import ThreadingEPCServer

args = sys.argv[1:]
assert args[0] == "serve", args
home = args[args.index("--home") + 1]
connection_file = args[args.index("--connection-file") + 1] if "--connection-file" in args else None
refuse = "--refuse" in args
secret = os.environ.pop("OPENCORTEX_SECRET", None) or secrets.token_hex(32)
server = ThreadingEPCServer(("127.0.0.1", 0))
turns = [0]
approvals = {}


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
              {"command": "echo hi", "argv": ["echo", "hi"], "cwd": home,
               "reason": "a test", "timeout": 30})
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
            "backend": "fake", "warning": None,
            "memory-file": os.path.join(home, f"emacs-{chat_id}.org")}


@method("abort-turn")
def abort_turn(chat_id):
    return False


@method("slash-command")
def slash_command(chat_id, text):
    return {"text": "fake help"}


server.print_port()
if connection_file:
    descriptor = os.open(connection_file + ".tmp", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"port": server.server_address[1], "secret": secret, "pid": os.getpid()},
                  handle)
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
    run_ert("(not (tag kernel))", dict(os.environ))


def test_ert_with_kernel_stand_in(tmp_path):
    script = tmp_path / "kernel_stand_in.py"
    script.write_text(KERNEL_STAND_IN)
    env = {k: v for k, v in os.environ.items() if k != "OPENCORTEX_SECRET"}
    env.update(OPENCORTEX_TEST_FAKE_KERNEL=str(script), OPENCORTEX_TEST_PYTHON=sys.executable)
    run_ert("(tag kernel)", env)
