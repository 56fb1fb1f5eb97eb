"""Start-up: `opencortex serve` prints its port before it reads its configuration or
builds the kernel (early calls wait), and the message index opens only when first used.

A skill that blocks its own loading until the test opens a gate shows the order:
the port line and the connection file come first; a client that connects and
calls at once is answered once the kernel is built, and never refused.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time

import pytest
from epc.client import EPCClient

from opencortex.homelock import HomeLock
from opencortex.memory.index import MessageIndex
from opencortex.serve_port import (Stopped, bound_port, default_connection_file,
                                   noting_stop_signals)

from conftest import cli_env
from test_epc import Kernel

GATED = """\
(import os time)
(setv gate (os.environ.get "OC_TEST_GATE"))
(for [_ (range 1200)]
  (when (os.path.exists (os.path.join gate "open")) (break))
  (time.sleep 0.05))
(with [f (open (os.path.join gate "loaded") "w")] (.write f "yes"))
(defskill gated :trigger (fn [ctx] False))
"""


def early_calls(port: int, secret: str, answers: dict) -> None:
    """Authenticate and ask for a status as soon as the port is known; keep the answers."""
    client = EPCClient(("127.0.0.1", port))
    try:
        answers["authenticate"] = client.call_sync("authenticate", [secret], timeout=120)
        answers["status"] = client.call_sync("status", ["early"], timeout=120)
    except Exception as error:                    # the assertions below say what failed
        answers["error"] = repr(error)
    finally:
        client.close()


def test_port_line_comes_before_the_build_and_early_calls_wait(home, tmp_path):
    skills, gate, runtime = tmp_path / "skills", tmp_path / "gate", tmp_path / "run"
    skills.mkdir()
    gate.mkdir()
    (skills / "gated.hy").write_text(GATED, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "opencortex", "serve", "--home", str(home), "--backend", "echo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(home, XDG_RUNTIME_DIR=str(runtime), OPENCORTEX_SKILL_DIRS=str(skills),
                    OC_TEST_GATE=str(gate)))
    try:
        line = process.stdout.readline()
        assert line.strip().isdigit(), (line, process.stderr.read())
        assert not (gate / "loaded").exists()          # the skills load after the port line
        written = default_connection_file(home, runtime / "opencortex")
        secret = json.loads(written.read_text())["secret"]
        answers: dict = {}
        caller = threading.Thread(target=early_calls, args=(int(line), secret, answers))
        caller.start()
        (gate / "open").touch()
        caller.join(timeout=180)
        assert answers.get("authenticate") is True, answers
        assert "echo" in answers["status"]                 # a plist: (... :backend "echo" ...)
        assert (gate / "loaded").exists()
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
        process.stdout.close()
        process.stderr.close()
    assert not written.exists()
    cached = list((home / "cache" / "skills").iterdir())
    assert cached and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in cached)


# What serve has imported when it prints its port line (a run stopped right there).
AT_THE_PORT_LINE = """\
import sys
import opencortex.serve_port as port
def announce(self, stdout, **extra):
    heavy = ("pydantic", "asyncio", "opencortex.config", "opencortex.kernel")
    print(sorted(name for name in heavy if name in sys.modules))
    raise SystemExit(0)
port.Bound.announce = announce
from opencortex.cli import main
main(["serve", "--home", sys.argv[1], "--backend", "echo"])
"""


def test_the_port_line_comes_before_the_configuration_and_asyncio_are_imported(home,
                                                                                 tmp_path):
    """Issue 14: the port line within 0.3 s.  Reading the configuration imports pydantic and
    every settings model (0.2-0.25 s of a 0.32-0.39 s port line on a slow day): the port
    comes first now, so nothing heavy may creep back in before it."""
    result = subprocess.run([sys.executable, "-c", AT_THE_PORT_LINE, str(home)],
                            capture_output=True, text=True, timeout=120,
                            env=cli_env(home, XDG_RUNTIME_DIR=str(tmp_path / "run")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_a_configuration_error_after_the_port_line_is_said_and_leaves_nothing_behind(
        home, tmp_path):
    (home / "config.toml").write_text('event_loop = "tokio"\n')
    runtime = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "opencortex", "serve", "--home", str(home), "--backend", "echo"],
        capture_output=True, text=True, timeout=120,
        env=cli_env(home, XDG_RUNTIME_DIR=str(runtime)))
    assert result.stdout.strip().isdigit()              # the port came first, as always
    assert result.returncode != 0 and "event_loop" in result.stderr, result.stderr
    assert not default_connection_file(home, runtime / "opencortex").exists()
    HomeLock(home).release()                            # given back: it can be taken again


def test_a_stop_signal_before_the_event_loop_gives_the_port_and_the_lock_back(home, tmp_path):
    """Between the port line and the event loop (the configuration read, the imports) a
    SIGTERM must not end the process where it stands: the connection file would stay,
    naming a port nobody answers on.  It is noted, and the start stops where it checks."""
    written = tmp_path / "run" / "kernel.json"
    with pytest.raises(Stopped):
        with noting_stop_signals() as signals, bound_port(home, connection_file=written) as bound:
            bound.announce(io.StringIO())
            assert written.exists()
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):                # the handler runs at the next bytecode
                time.sleep(0.01)
            signals.check()
    assert not written.exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL    # as it was before
    HomeLock(home).release()


def test_a_stop_signal_during_the_start_raises_nothing_where_it_lands(home):
    """An exception raised where the signal landed came out of the start as another error:
    inside a class being made, Python 3.11 turns it into a RuntimeError (a descriptor's
    __set_name__), pydantic into a SchemaError; `serve` then exited 1 ("unexpected
    RuntimeError"), and once in a while the start hung.  The signal is only noted."""
    class Named:
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):                # the handler runs at the next bytecode
                time.sleep(0.01)
    with noting_stop_signals() as signals:
        class Made:                             # a class made while the signal lands
            field = Named()
        assert signals.received == "SIGTERM"
        with pytest.raises(Stopped):
            signals.check()
    assert Made.__dict__["field"] is not None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_sigterm_right_after_the_port_line_stops_the_kernel_cleanly(home, tmp_path):
    """SIGTERM while the start reads its configuration, imports and builds (0 to 0.2 s
    after the port line): exit 0, nothing "unexpected" said, no connection file left."""
    for delay in (0.0, 0.05, 0.2):
        kernel = Kernel(home, tmp_path / "run", "--backend", "echo")
        time.sleep(delay)
        assert kernel.stop() == 0 and "unexpected" not in kernel.said, kernel.said
        assert not kernel.connection_file.exists()


def test_the_index_opens_on_first_use(tmp_path):
    index = MessageIndex(tmp_path / "index.sqlite")
    assert not (tmp_path / "index.sqlite").exists()
    assert index.search("anything", None, 5) == [] and (tmp_path / "index.sqlite").exists()
    assert index.count() == 0
    index.close()
    with pytest.raises(sqlite3.ProgrammingError):
        index.count()


def test_an_index_closed_unopened_stays_closed(tmp_path):
    index = MessageIndex(tmp_path / "index.sqlite")
    index.close()
    with pytest.raises(sqlite3.ProgrammingError):
        index.file_sizes()
    assert not (tmp_path / "index.sqlite").exists()


def test_serving_moves_start_up_out_of_the_collectors_sight():
    """Once built, a serving kernel freezes what start-up made and collects young
    objects in larger batches (in a child process: it changes the whole process)."""
    code = ("import gc\n"
            "from opencortex.serve import YOUNG_COLLECTION, settle_collector\n"
            "settle_collector()\n"
            "assert gc.get_threshold()[0] == YOUNG_COLLECTION, gc.get_threshold()\n"
            "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_after_a_reload_what_the_old_skills_left_is_collected():
    """Frozen with start-up, the old skills' cycles (modules, functions) would never be
    collected after /reload; serve re-settles the collector after each (in a child
    process: freezing changes the whole process)."""
    code = ("import gc, weakref\n"
            "from opencortex.serve import resettle_collector, settle_collector\n"
            "class Skill:\n"
            "    pass\n"
            "old = Skill(); old.me = old          # a cycle, as a module and its functions\n"
            "gone = weakref.ref(old)\n"
            "settle_collector()\n"
            "del old\n"
            "gc.collect()\n"
            "assert gone() is not None            # frozen: never collected\n"
            "resettle_collector()\n"
            "assert gone() is None\n"
            "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
