"""What one Emacs connection, a child process or another user can see of the kernel.

Runs the real `opencortex serve`: each Emacs connection gets the streams and
replies of its own turns; the kernel's secret and provider keys are not in its
/proc/<pid>/environ; the runtime directory is private or refused.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env
from opencortex.serve_port import UnsafeDirectory, private_directory
from test_epc import FakeEmacs, finals, plist, start  # noqa: F401  (start: a fixture)


def test_each_emacs_gets_the_streams_and_replies_of_its_own_turns(start):
    kernel, first = start()
    second = FakeEmacs(kernel.port)
    try:
        assert second.call("authenticate", kernel.secret()) is True
        acks = {first: [], second: []}
        for i in range(3):
            for emacs, who in ((first, "A"), (second, "B")):
                acks[emacs].append(plist(emacs.call("send-message", "main", f"{who} {i}"))
                                   ["turn-id"])
        for emacs, who in ((first, "A"), (second, "B")):
            assert wait_texts(emacs, 3) == [f"* [Echo] {who} {i}\n" for i in range(3)]
            streamed = {args[0] for args in emacs.wait_for("opencortex-stream", 6)}
            assert streamed == set(acks[emacs])
            statuses = {plist(args[0])["turn-id"]
                        for args in emacs.wait_for("opencortex-status-changed", 3)}
            assert statuses == set(acks[emacs])
        first.close()
        plist(second.call("send-message", "main", "B after A left"))
        assert wait_texts(second, 4)[-1] == "* [Echo] B after A left\n"
    finally:
        second.close()


def wait_texts(emacs: FakeEmacs, count: int, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(finals(emacs)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return finals(emacs)


def test_the_secret_and_provider_keys_are_not_in_proc_environ(start):
    kernel, emacs = start("--backend", "echo", authenticate=False,
                          OPENCORTEX_SECRET="s3cret-canary-0123", ANTHROPIC_API_KEY="sk-canary",
                          SOME_SERVICE_TOKEN="tok-canary")
    shown = Path(f"/proc/{kernel.process.pid}/environ").read_bytes()
    assert b"s3cret-canary-0123" not in shown and b"sk-canary" not in shown
    assert b"tok-canary" not in shown
    assert b"ANTHROPIC_API_KEY=*********\0" in shown    # names and lengths stay
    assert emacs.call("authenticate", "s3cret-canary-0123") is True


def test_the_runtime_directory_is_created_private(tmp_path):
    made = private_directory(tmp_path / "run" / "opencortex")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_a_group_writable_runtime_directory_is_refused(tmp_path):
    shared = tmp_path / "opencortex"
    shared.mkdir()
    shared.chmod(0o770)
    with pytest.raises(UnsafeDirectory, match=f"{shared} is writable by group or others .*"
                                              f"chmod 700 {shared}"):
        private_directory(shared)


def test_a_symlinked_runtime_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "opencortex").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeDirectory, match="not a plain directory"):
        private_directory(tmp_path / "opencortex")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_runtime_directory_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "opencortex"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeDirectory, match="belongs to another user"):
        private_directory(theirs)


def test_serve_refuses_an_unsafe_runtime_directory_with_a_clear_error(home, tmp_path):
    runtime = tmp_path / "run"
    (runtime / "opencortex").mkdir(parents=True)
    (runtime / "opencortex").chmod(0o777)
    done = subprocess.run([sys.executable, "-m", "opencortex", "serve", "--home", str(home)],
                          capture_output=True, text=True, timeout=60,
                          env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)))
    assert done.returncode != 0 and done.stdout == ""
    assert "is writable by group or others" in done.stderr
    assert f"chmod 700 {runtime / 'opencortex'}" in done.stderr
    assert list((runtime / "opencortex").iterdir()) == []
