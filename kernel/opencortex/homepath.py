"""Where a home is, without reading its configuration: its directory, the TOML file
that configures it, and where its archive lives.

Light (no pydantic, no asyncio): `serve` holds the home's lock and prints its port line
before the configuration's models are even imported (see `serve_port`); `config` reads
the same paths.
- home (memory, runtime files): `--home DIR`, else `$OPENCORTEX_HOME`,
  else `$XDG_DATA_HOME/opencortex` (`~/.local/share/opencortex`).
- the TOML file: `$OPENCORTEX_CONFIG`, else `HOME/config.toml` when `--home` or
  `$OPENCORTEX_HOME` names a home, else `$XDG_CONFIG_HOME/opencortex/config.toml`.
"""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(name: str, fallback: str) -> Path:
    value = os.environ.get(name)
    return Path(value) if value else Path.home() / fallback


def default_home() -> Path:
    """The home when none is named: `$OPENCORTEX_HOME`, else the XDG data directory's."""
    if os.environ.get("OPENCORTEX_HOME"):
        return Path(os.environ["OPENCORTEX_HOME"])
    return _xdg("XDG_DATA_HOME", ".local/share") / "opencortex"


def home_of(home: Path | str | None) -> Path:
    """The home directory HOME names (None: the default one), absolute."""
    return (Path(home).expanduser() if home is not None else default_home()).resolve()


def config_path(home: Path | None) -> Path:
    """The TOML file configuring HOME (None: no home named; see the module notes)."""
    if os.environ.get("OPENCORTEX_CONFIG"):
        return Path(os.environ["OPENCORTEX_CONFIG"])
    if home is not None or os.environ.get("OPENCORTEX_HOME"):
        return (home or default_home()) / "config.toml"
    return _xdg("XDG_CONFIG_HOME", ".config") / "opencortex" / "config.toml"


def memory_dir(home: Path) -> Path:
    """Where HOME's archive (org files, index) lives."""
    return home / "memory"
