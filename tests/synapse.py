"""A real Matrix homeserver (Synapse) on 127.0.0.1, for the Matrix tests and the bridge benchmark.

Synapse pins many dependencies of its own, so it never shares the kernel's
environment: `ensure_synapse` installs it once (about 25 s, 240 MB) into a
virtual environment of its own, `<checkout>/.venv-synapse/env`, under a file
lock (parallel test runs wait for one install), and reuses it afterwards.
A failed or interrupted install is redone on the next call.

`Homeserver` runs one Synapse with SQLite in a work directory: a client
listener on a free loopback port and nothing else (no federation listener, no
key servers, no presence, no URL previews), cheap password hashing and rate
limits raised out of the way (a test that wants a limit sets one for one user
with `override_ratelimit`).  Accounts are made with the shared registration
secret (`register`).  `start` fails with Synapse's own last log lines when the
server does not come up; `stop` ends the process (terminate, then kill).
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIREMENT = "matrix-synapse>=1.163,<1.164"
SYNAPSE_DIR = REPO / ".venv-synapse"
INSTALL_TIMEOUT = 900.0   # seconds for creating the environment and installing Synapse
START_TIMEOUT = 120.0     # seconds for the server to answer /versions
SERVER_NAME = "localhost"
RAISED = {"per_second": 10000, "burst_count": 10000}


class HomeserverError(RuntimeError):
    """Synapse could not be installed or started; the message says why."""


def ensure_synapse() -> Path:
    """The Python of an environment with Synapse installed (installed now if missing)."""
    env = SYNAPSE_DIR / "env"
    python = env / "bin" / "python"
    stamp = env / ".opencortex-synapse"
    SYNAPSE_DIR.mkdir(exist_ok=True)
    with open(SYNAPSE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == REQUIREMENT and python.exists():
            return python
        shutil.rmtree(env, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(env)], "create its virtual environment")
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              REQUIREMENT], f"pip install '{REQUIREMENT}'")
        stamp.write_text(REQUIREMENT)
    return python


def _run(command: list[str], doing: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise HomeserverError(f"Synapse: could not {doing} within {INSTALL_TIMEOUT:g} s") from None
    if done.returncode != 0:
        raise HomeserverError(f"Synapse: could not {doing}:\n{done.stderr[-3000:]}")


def _die_with_parent() -> None:
    """In the child: be terminated when the test process dies, even by SIGKILL (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Account:
    user_id: str
    password: str
    access_token: str
    device_id: str


class Homeserver:
    """One Synapse process with its configuration, database and log under WORKDIR."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secrets.token_hex(16)
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / "homeserver.log"

    # -- configuration ------------------------------------------------------------

    def _configure(self) -> Path:
        """Write the signing key, the log configuration and homeserver.yaml; its path."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        seed = base64.b64encode(os.urandom(32)).decode().rstrip("=")
        (self.workdir / "signing.key").write_text(f"ed25519 a_test {seed}\n")
        (self.workdir / "log.yaml").write_text(json.dumps({
            "version": 1,
            "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
            "handlers": {"file": {"class": "logging.FileHandler", "formatter": "plain",
                                  "filename": str(self.log_path)}},
            "root": {"level": "WARNING", "handlers": ["file"]},
            "disable_existing_loggers": False}))
        config = {
            "server_name": SERVER_NAME,
            "pid_file": str(self.workdir / "homeserver.pid"),
            "listeners": [{"port": self.port, "bind_addresses": ["127.0.0.1"], "type": "http",
                           "tls": False, "x_forwarded": False,
                           "resources": [{"names": ["client"], "compress": False}]}],
            "database": {"name": "sqlite3",
                         "args": {"database": str(self.workdir / "homeserver.db")}},
            "log_config": str(self.workdir / "log.yaml"),
            "media_store_path": str(self.workdir / "media"),
            "signing_key_path": str(self.workdir / "signing.key"),
            "registration_shared_secret": self.secret,
            "macaroon_secret_key": secrets.token_hex(16),
            "form_secret": secrets.token_hex(16),
            "report_stats": False,
            "enable_metrics": False,
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "bcrypt_rounds": 4,
            "presence": {"enabled": False},
            "url_preview_enabled": False,
            "enable_registration": False,
            **self._rate_limits(),
        }
        path = self.workdir / "homeserver.yaml"
        path.write_text(json.dumps(config, indent=1))   # JSON is YAML
        return path

    @staticmethod
    def _rate_limits() -> dict[str, object]:
        """Every client-side limit raised far above what a test sends."""
        return {"rc_message": RAISED, "rc_registration": RAISED,
                "rc_login": {"address": RAISED, "account": RAISED, "failed_attempts": RAISED},
                "rc_joins": {"local": RAISED, "remote": RAISED}, "rc_joins_per_room": RAISED,
                "rc_invites": {"per_room": RAISED, "per_user": RAISED, "per_issuer": RAISED},
                "rc_key_requests": RAISED, "rc_room_creation": RAISED,
                "rc_presence": {"per_user": RAISED}, "rc_delayed_event_mgmt": RAISED,
                "rc_3pid_validation": RAISED, "rc_admin_redaction": RAISED,
                "rc_media_create": RAISED, "rc_reports": RAISED, "rc_profile": RAISED,
                "rc_user_directory": RAISED}

    # -- the process ----------------------------------------------------------------

    def start(self) -> None:
        """Install Synapse if needed, start it, and wait until it answers."""
        python = ensure_synapse()
        config = self._configure()
        with open(self.workdir / "stdout", "wb") as output:
            self.process = subprocess.Popen(
                [str(python), "-m", "synapse.app.homeserver", "--config-path", str(config)],
                cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HomeserverError(f"Synapse exited with {self.process.returncode}:\n"
                                      f"{self.last_lines()}")
            try:
                self.request("GET", "/_matrix/client/versions", timeout=2)
                return
            except (OSError, HomeserverError):
                time.sleep(0.1)
        self.stop()
        raise HomeserverError(f"Synapse did not answer within {START_TIMEOUT:g} s:\n"
                              f"{self.last_lines()}")

    def last_lines(self, count: int = 30) -> str:
        """The end of Synapse's output and log, for a failure message."""
        text = ""
        for path in (self.workdir / "stdout", self.log_path):
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-count:]) + "\n"
        return text

    def stop(self) -> None:
        """End the server (terminate, then kill after 15 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> Homeserver:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- the admin API ------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, token: str = "",
                timeout: float = 30) -> dict:
        """One JSON request to the server; HomeserverError for an HTTP error."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            raise HomeserverError(f"{method} {path}: {error.code} "
                                  f"{error.read()[:500].decode(errors='replace')}") from None

    def register(self, localpart: str, admin: bool = False) -> Account:
        """A new account LOCALPART (with a random password), by the shared secret."""
        password = secrets.token_urlsafe(12)
        path = "/_synapse/admin/v1/register"
        nonce = self.request("GET", path)["nonce"]
        mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), localpart.encode(), password.encode(),
                                 b"admin" if admin else b"notadmin"]))
        answer = self.request("POST", path, {"nonce": nonce, "username": localpart,
                                             "password": password, "admin": admin,
                                             "mac": mac.hexdigest()})
        return Account(answer["user_id"], password, answer["access_token"], answer["device_id"])

    def override_ratelimit(self, admin: Account, user_id: str, per_second: int,
                           burst: int) -> None:
        """Give USER_ID its own message rate limit (whole messages per second; 0: none)."""
        self.request("POST", f"/_synapse/admin/v1/users/{user_id}/override_ratelimit",
                     {"messages_per_second": per_second, "burst_count": burst},
                     token=admin.access_token)


if __name__ == "__main__":   # `python tests/synapse.py`: install Synapse now (CI may prepare)
    print(ensure_synapse())
