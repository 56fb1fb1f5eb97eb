"""The `[bridges.NAME]` tables of the configuration: who may talk, how fast, what is kept.

    [bridges.telegram]
    enabled = true
    token_env = "OPENCORTEX_TELEGRAM_TOKEN"  # the token is read from this variable,
                                             # never written in the file
    allow = ["123456789"]         # sender ids (numeric; usernames change) — deny by default
    groups = []                   # group chat ids the bot answers in (mention or reply only)
    approvers = []                # sender ids who may decide any approval (besides the asker)
    strangers = "refuse"          # "refuse": one short reply now and then; "silence": nothing
    messages_per_minute = 20      # per sender; the excess is answered once with a notice
    archive = true                # false: working memory only, nothing in the org archive

This module imports nothing of opencortex, so `config.py` can hold the table.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Id = str


class BridgeSettings(BaseModel):
    """One bridge's settings; platform modules add their own fields by subclassing."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    token_env: str = ""
    allow: list[Id] = Field(default_factory=list)
    groups: list[Id] = Field(default_factory=list)
    approvers: list[Id] = Field(default_factory=list)
    strangers: Literal["refuse", "silence"] = "refuse"
    refusal_text: str = "Sorry, this is a private assistant."
    refusal_interval: float = Field(3600.0, ge=0)    # seconds between refusals to one stranger
    messages_per_minute: int = Field(20, ge=1, le=600)
    archive: bool = True
    approval_timeout: float | None = Field(None, gt=0)  # default: [emacs] approval_timeout

    @field_validator("allow", "groups", "approvers", mode="before")
    @classmethod
    def _ids_as_text(cls, value: object) -> object:
        """Ids may be written as numbers in TOML; they are compared as text."""
        if isinstance(value, list):
            return [str(item) if isinstance(item, int) and not isinstance(item, bool) else item
                    for item in value]
        return value

    def secret_envs(self) -> list[str]:
        """The environment variables that may hold the bridge's secret, preferred first."""
        return [self.token_env]


class TelegramSettings(BridgeSettings):
    """`[bridges.telegram]`: the Bot API, by long polling unless a webhook is configured.

    With `webhook_url` set, Telegram POSTs updates to that public https URL; a reverse
    proxy terminates TLS there and forwards to plain HTTP on webhook_listen:webhook_port.
    The secret token Telegram sends with each update is read from $webhook_secret_env."""

    token_env: str = "OPENCORTEX_TELEGRAM_TOKEN"
    base_url: str = "https://api.telegram.org/bot"   # the Bot API (a test points it at loopback)
    poll_timeout: int = Field(30, ge=0, le=50)        # seconds a getUpdates call may wait
    webhook_url: str = ""                             # set: Telegram POSTs updates there
    webhook_path: str = ""                            # served path; "": webhook_url's path
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = Field(8443, ge=0, le=65535)   # 0: any free port (tests)
    webhook_secret_env: str = "OPENCORTEX_TELEGRAM_WEBHOOK_SECRET"

    @field_validator("webhook_url")
    @classmethod
    def _https(cls, value: str) -> str:
        """Telegram delivers to https URLs only."""
        if value and not value.startswith("https://"):
            raise ValueError("webhook_url must be an https:// URL (Telegram delivers over "
                             "TLS only; a reverse proxy terminates it)")
        return value

    @field_validator("webhook_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        """A path the receiver serves, like "/telegram"."""
        if value and not value.startswith("/"):
            raise ValueError(f"webhook_path {value!r} must start with /")
        return value


_UUID = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_NUMBER = re.compile(r"^\+[1-9][0-9]{5,17}$")


class SignalSettings(BridgeSettings):
    """`[bridges.signal]`: signal-cli's JSON-RPC daemon, on its UNIX socket or on TCP.

    Senders are Signal UUIDs (numbers change).  `allow` takes UUIDs or numbers
    ("+15551234567": it matches the number Signal gives for the sender, whose
    UUID is then what the kernel sees); `approvers` take UUIDs only; `groups`
    take signal-cli's base64 group ids.  No token: the daemon's socket is local."""

    token_env: str = ""
    address: str = ""      # "": $XDG_RUNTIME_DIR/signal-cli/socket; a socket path; or HOST:PORT
    account: str = ""      # the bot's number; needed when the daemon serves several accounts
    poll_timeout: float = Field(30.0, gt=0, le=300)      # seconds a fetch waits for messages
    connect_timeout: float = Field(10.0, gt=0, le=120)   # seconds to reach the daemon
    call_timeout: float = Field(60.0, gt=0, le=600)      # seconds one request may take

    @field_validator("allow")
    @classmethod
    def _uuids_or_numbers(cls, value: list[str]) -> list[str]:
        """UUIDs (lower case, as signal-cli writes them) or numbers in +E.164 form."""
        bad = [item for item in value if not (_UUID.match(item) or _NUMBER.match(item))]
        if bad:
            raise ValueError(f"{bad[0]!r} is neither a Signal UUID nor a number like "
                             "+15551234567")
        return [item.lower() if _UUID.match(item) else item for item in value]

    @field_validator("approvers")
    @classmethod
    def _uuids_only(cls, value: list[str]) -> list[str]:
        """Approvers decide by UUID; `signal-cli -a NUMBER listContacts` shows them."""
        bad = [item for item in value if not _UUID.match(item)]
        if bad:
            raise ValueError(f"approvers take Signal UUIDs (numbers change), not {bad[0]!r}; "
                             "`signal-cli -a NUMBER listContacts` shows them")
        return [item.lower() for item in value]

    @field_validator("account")
    @classmethod
    def _a_number(cls, value: str) -> str:
        """The bot's own number, in +E.164 form, or "" (learned from the daemon)."""
        if value and not _NUMBER.match(value):
            raise ValueError(f"account {value!r} is not a number like +15551234567")
        return value


class MatrixSettings(BridgeSettings):
    """`[bridges.matrix]`: one Matrix account through matrix-nio, encrypted rooms included.

        [bridges.matrix]
        enabled = true
        homeserver = "https://matrix.example.org"
        user_id = "@opencortex:example.org"
        password_env = "OPENCORTEX_MATRIX_PASSWORD"  # or an access token in token_env
        allow = ["@you:example.org"]                 # MXIDs
        groups = []                                  # room ids ("!abc:example.org"), not aliases
        trust = "tofu"       # "verified": only the devices listed in verified_devices

    The device id, crypto keys, sync position and the access token of a password
    login are kept in HOME/bridges/matrix/ (mode 0700).
    """

    token_env: str = "OPENCORTEX_MATRIX_TOKEN"         # an access token (preferred when set)
    password_env: str = "OPENCORTEX_MATRIX_PASSWORD"   # else a password to log in with
    homeserver: str = ""                               # the client-server API's base URL
    user_id: str = ""                                  # the bot's MXID
    device_id: str = ""              # empty: the first login's device, kept in the home
    device_name: str = "opencortex"
    trust: Literal["tofu", "verified"] = "tofu"   # tofu: allowed users' devices, as first seen
    verified_devices: dict[str, dict[str, str]] = Field(default_factory=dict)
    # ^ "verified": MXID -> {device id: its ed25519 fingerprint (spaces ignored)}
    poll_timeout: int = Field(30, ge=1, le=120)   # seconds a /sync may wait

    @field_validator("allow", "approvers")
    @classmethod
    def _mxids(cls, value: list[str]) -> list[str]:
        """Matrix senders are MXIDs: `@localpart:server`."""
        for item in value:
            if not (item.startswith("@") and ":" in item):
                raise ValueError(f"{item!r} is not a Matrix user id like @you:example.org")
        return value

    @field_validator("groups")
    @classmethod
    def _room_ids(cls, value: list[str]) -> list[str]:
        """Groups are room ids (`!abc:server`; `!abc` from room version 12), not aliases:
        aliases can move."""
        for item in value:
            if not item.startswith("!") or len(item) < 2:
                raise ValueError(f"{item!r} is not a Matrix room id like !abc:example.org")
        return value

    @model_validator(mode="after")
    def _account(self) -> "MatrixSettings":
        """An enabled bridge names its homeserver (http or https) and its account."""
        if self.enabled and not self.homeserver.startswith(("https://", "http://")):
            raise ValueError("[bridges.matrix] homeserver must be an https:// URL")
        if self.enabled and not (self.user_id.startswith("@") and ":" in self.user_id):
            raise ValueError("[bridges.matrix] user_id must be the bot's MXID (@bot:server)")
        return self

    def secret_envs(self) -> list[str]:
        return [self.token_env, self.password_env]


class BridgesSettings(BaseModel):
    """The `[bridges]` table: one entry per platform."""

    model_config = ConfigDict(extra="forbid")

    telegram: TelegramSettings = Field(default_factory=TelegramSettings)
    matrix: MatrixSettings = Field(default_factory=MatrixSettings)
    signal: SignalSettings = Field(default_factory=SignalSettings)

    def enabled(self) -> dict[str, BridgeSettings]:
        """The bridges switched on, by name."""
        return {name: getattr(self, name) for name in type(self).model_fields
                if getattr(self, name).enabled}
