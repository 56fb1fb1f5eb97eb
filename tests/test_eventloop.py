"""Which event loop `opencortex serve` runs on (opencortex.eventloop).

The served kernel's own report of its loop is tested over real EPC in test_epc.py.
"""

from __future__ import annotations

import asyncio
import sys
import warnings

import pytest
import uvloop

from opencortex import cli
from opencortex.eventloop import EventLoopUnavailable, loop_factory, loop_name, run


async def running_loop_name() -> str:
    return loop_name(asyncio.get_running_loop())


def test_auto_and_uvloop_run_on_uvloop_and_asyncio_on_asyncios_own():
    assert loop_factory("auto") is uvloop.new_event_loop
    assert run(running_loop_name(), "auto") == "uvloop"
    assert run(running_loop_name(), "uvloop") == "uvloop"
    assert loop_factory("asyncio") is None
    assert run(running_loop_name(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)        # import uvloop fails
    assert loop_factory("auto") is None
    assert run(running_loop_name(), "auto") == "asyncio"
    main = running_loop_name()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # "never awaited" would fail
        with pytest.raises(EventLoopUnavailable, match="uvloop is not installed"):
            run(main, "uvloop")
    assert main.cr_frame is None                            # closed, never started


def test_serve_refuses_to_start_on_a_missing_uvloop_with_the_reason(home, monkeypatch, capsys):
    (home / "config.toml").write_text('event_loop = "uvloop"\n')
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert cli.main(["serve", "--home", str(home)]) != 0
    assert "uvloop is not installed" in capsys.readouterr().err


def test_an_unknown_event_loop_is_a_configuration_error(home):
    (home / "config.toml").write_text('event_loop = "tokio"\n')
    assert cli.main(["serve", "--home", str(home)]) != 0


def test_doctor_names_the_loop_serve_will_run_on(home, monkeypatch):
    from opencortex.config import load_config
    from opencortex.doctor import run_checks

    def check(**config):
        [found] = [c for c in run_checks(load_config(home, **config)) if c.name == "event loop"]
        return found

    assert check().ok and check().detail.startswith("uvloop ")
    assert check(event_loop="asyncio").ok and "asyncio's own" in check(event_loop="asyncio").detail
    monkeypatch.setitem(sys.modules, "uvloop", None)
    missing = check()
    assert not missing.ok and missing.optional and "not installed" in missing.detail
    insisted = check(event_loop="uvloop")
    assert not insisted.ok and not insisted.optional and insisted.fix == "pip install uvloop"
