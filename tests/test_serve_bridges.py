"""One always-on kernel per home with its bridges: a second kernel is refused, a SIGKILL
mid-turn loses nothing and answers nothing twice, SIGTERM finishes the turn in flight.

Runs the real `opencortex serve` with the Telegram bridge against the loopback fake
Bot API (served from a thread of the test process)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import cli_env
from telegram_fake import FakeBotApi
from test_epc import Kernel

TOKEN = "4242:serve-canary-token"
OWNER = 7


class FakeInThread:
    """The fake Bot API on its own event loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = FakeBotApi(TOKEN)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> "FakeInThread":
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.api.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.api.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def call(self, function, *args):
        """Run FUNCTION(*ARGS) on the fake's loop and return its result."""
        done = threading.Event()
        box: list = []

        def inside():
            box.append(function(*args))
            done.set()
        self.loop.call_soon_threadsafe(inside)
        assert done.wait(10)
        return box[0]

    def replies(self) -> list[str]:
        return self.call(lambda: [s.text for s in self.api.sent if s.chat_id == str(OWNER)])


def wait_until(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def bridge_home(home, tmp_path):
    """A home whose kernel runs the Telegram bridge with a slow scripted reply."""
    script = tmp_path / "slow.jsonl"
    reply = f'(:type :REQUEST :target :telegram :chat-id "{OWNER}" :text "slow answer")'
    script.write_text(json.dumps({"text": reply, "delay": 0.2, "chunks": [
        reply[i:i + 8] for i in range(0, len(reply), 8)]}) + "\n")
    with FakeInThread() as fake:
        (home / "config.toml").write_text(
            f'backend = "script"\nscript = "{script}"\n'
            f'[bridges.telegram]\nenabled = true\nbase_url = "{fake.url}"\n'
            f'token_env = "TEST_TELEGRAM_TOKEN"\nallow = [{OWNER}]\npoll_timeout = 1\n')
        yield home, fake


def serve(home: Path, runtime: Path) -> Kernel:
    return Kernel(home, runtime, TEST_TELEGRAM_TOKEN=TOKEN)


def test_a_second_kernel_on_the_same_home_is_refused_naming_the_first(bridge_home, tmp_path):
    home, _ = bridge_home
    first = serve(home, tmp_path / "run")
    try:
        second = subprocess.run([sys.executable, "-m", "opencortex", "serve", "--home",
                                 str(home)], capture_output=True, text=True, timeout=60,
                                env=cli_env(home, XDG_RUNTIME_DIR=str(tmp_path / "run")))
        assert second.returncode == 1 and second.stdout == ""
        assert f"a kernel is already running for {home.resolve()}" in second.stderr
        assert f"pid {first.process.pid}" in second.stderr
        assert f"EPC port {first.port}" in second.stderr
    finally:
        assert first.stop() == 0, first.said


def test_sigkill_mid_turn_then_restart_answers_once_and_loses_nothing(bridge_home, tmp_path):
    home, fake = bridge_home
    kernel = serve(home, tmp_path / "run")
    fake.call(fake.api.send, OWNER, "hello")
    wait_until(lambda: fake.call(lambda: bool(fake.api.actions)))       # the turn runs
    kernel.process.send_signal(signal.SIGKILL)
    kernel.process.wait(10)
    kernel.stop()
    assert fake.replies() == []
    again = serve(home, tmp_path / "run")
    try:
        wait_until(lambda: fake.replies())
        time.sleep(1.5)                                   # room for a wrong second answer
        assert fake.replies() == ["slow answer"]
        archive = (home / "memory" / "telegram" / f"{OWNER}.org").read_text()
        assert archive.count(":ROLE:     user") == 1 and "slow answer" in archive
    finally:
        assert again.stop() == 0, again.said


def test_sigterm_lets_the_turn_in_flight_finish(bridge_home, tmp_path):
    home, fake = bridge_home
    kernel = serve(home, tmp_path / "run")
    fake.call(fake.api.send, OWNER, "hello")
    wait_until(lambda: fake.call(lambda: bool(fake.api.actions)))
    assert kernel.stop() == 0, kernel.said  # SIGTERM, then wait
    assert fake.replies() == ["slow answer"]
    inbox = (home / "bridges" / "telegram.inbox.jsonl").read_text()
    pending = [json.loads(line) for line in inbox.splitlines() if line.strip()]
    added = {r["add"]["position"] for r in pending if "add" in r}
    done = {r["done"] for r in pending if "done" in r}
    assert added <= done


def test_serve_with_the_wire_and_opencortex_client(home, tmp_path):
    runtime = tmp_path / "run"
    kernel = Kernel(home, runtime, "--ws", "0", "--backend", "echo")
    try:
        info = json.loads(kernel.connection_file.read_text())
        assert info["ws_port"] > 0 and len(info["ws_token"]) >= 32
        done = subprocess.run([sys.executable, "-m", "opencortex", "client", "--home", str(home)],
                              input="hello over the wire\n", capture_output=True, text=True,
                              timeout=60, env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)))
        assert done.returncode == 0, done.stderr
        assert "[Echo] hello over the wire" in done.stdout
    finally:
        assert kernel.stop() == 0, kernel.said
    archive = (home / "memory" / "cli" / "wire.org").read_text()
    assert "hello over the wire" in archive


def test_chat_on_a_home_a_kernel_serves_is_refused(home, tmp_path):
    runtime = tmp_path / "run"
    kernel = Kernel(home, runtime, "--backend", "echo")
    try:
        done = subprocess.run([sys.executable, "-m", "opencortex", "chat", "--json", "-m", "hi",
                               "--home", str(home)], capture_output=True, text=True, timeout=60,
                              env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)))
        assert done.returncode == 1
        error = json.loads(done.stdout)["error"]
        assert "already running" in error and "opencortex client" in error
    finally:
        assert kernel.stop() == 0, kernel.said
