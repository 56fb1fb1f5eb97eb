"""Starting the bridges a configuration enables, inside one long-lived kernel.

Each enabled `[bridges.NAME]` becomes a `Bridge` with its platform, its durable
inbox under `HOME/bridges/`, and its token read from the environment variable
the configuration names.  A bridge that cannot start (no token) is reported and
left out; one that fails while running retries on its own: neither takes down
the kernel or the other bridges.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from opencortex.bridges.contract import BridgeError, Platform
from opencortex.bridges.inbox import Inbox
from opencortex.bridges.service import Bridge
from opencortex.bridges.settings import BridgeSettings
from opencortex.config import Config
from opencortex.kernel import Kernel

log = logging.getLogger(__name__)


def _telegram(settings: BridgeSettings, token: str, state: Path) -> Platform:
    from opencortex.bridges.telegram import TelegramPlatform
    return TelegramPlatform(settings, token)  # type: ignore[arg-type]


def _signal(settings: BridgeSettings, token: str, state: Path) -> Platform:
    from opencortex.bridges.signal import SignalPlatform
    return SignalPlatform(settings)  # type: ignore[arg-type]


def _matrix(settings: BridgeSettings, secret: str, state: Path) -> Platform:
    """The secret is the access token when $token_env is set (it is read first), else the
    password from $password_env."""
    from opencortex.bridges.matrix import MatrixPlatform
    password = not os.environ.get(settings.token_env, "")
    return MatrixPlatform(settings, secret, state, password=password)  # type: ignore[arg-type]


# name -> factory(settings, secret, the bridge's state directory HOME/bridges/NAME)
PLATFORMS: dict[str, Callable[[BridgeSettings, str, Path], Platform]] = {
    "telegram": _telegram, "signal": _signal, "matrix": _matrix}


def _secret(settings: BridgeSettings) -> tuple[str, str]:
    """The bridge's secret from the first of its variables that is set, and what is
    missing ("" when found, or when the platform needs no secret)."""
    names = [name for name in settings.secret_envs() if name]
    for name in names:
        if os.environ.get(name):
            return os.environ[name], ""
    return "", " or ".join(f"${name}" for name in names)


def build_bridges(config: Config, kernel: Kernel) -> tuple[list[Bridge], list[str]]:
    """The enabled bridges, and a problem line for each one that could not be built."""
    bridges, problems = [], []
    for name, settings in config.bridges.enabled().items():
        token, missing = _secret(settings)   # a platform without a secret names no variable
        if missing:
            problems.append(f"[bridges.{name}] is enabled but {missing} is not set; export "
                            f"the bot's secret in it and restart")
            continue
        inbox = Inbox(config.home / "bridges" / f"{name}.inbox.jsonl")
        platform = PLATFORMS[name](settings, token, config.home / "bridges" / name)
        bridges.append(Bridge(platform, settings, kernel, inbox,
                              config.emacs.approval_timeout))
    return bridges, problems


def run_bridges(bridges: list[Bridge], stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """Start every bridge's loop; each ends when STOP is set."""
    return [asyncio.create_task(bridge.run(stop), name=f"bridge-{bridge.channel}")
            for bridge in bridges]


async def check_bridge(name: str, settings: BridgeSettings, timeout: float = 15.0,
                       home: Path | None = None) -> tuple[bool, str, str]:
    """For `doctor`: (works, what was found, how to fix it) for the bridge NAME.
    Pass the kernel HOME: Matrix reuses the device and login kept there (without it, a
    password login makes a new device on every check)."""
    token, missing = _secret(settings)
    if missing:
        return False, f"{missing} is not set", \
            f"export the {name} secret in {missing} (never in config.toml)"
    with tempfile.TemporaryDirectory(prefix="opencortex-check-") as scratch:
        state = (home / "bridges" if home else Path(scratch)) / name
        return await _check(name, PLATFORMS[name](settings, token, state), timeout)


async def _check(name: str, platform: Platform, timeout: float) -> tuple[bool, str, str]:
    """Start PLATFORM once (bounded) and stop it: check_bridge's answer."""
    try:
        who = await asyncio.wait_for(platform.start(), timeout)
        return True, f"connected as {who or name}", ""
    except BridgeError as error:
        return False, str(error), f"check [bridges.{name}] and the network"
    except asyncio.TimeoutError:
        return False, f"no answer within {timeout:g} s", "check the network and the address"
    finally:
        await platform.stop()
