"""Configuration: one TOML file plus environment overrides, read into one typed Config.

Where things live (XDG base directories) is `homepath`'s: the home, the TOML file.

Environment overrides beat the file: OPENCORTEX_BACKEND, OPENCORTEX_MODEL (`[llm]
model`), OPENCORTEX_SCRIPT, OPENCORTEX_SKILL_DIRS (paths joined by the OS path
separator), OPENCORTEX_PERSONA.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opencortex.bridges.settings import BridgesSettings
from opencortex.budget_settings import BudgetSettings
from opencortex.conversation.settings import ConversationSettings
from opencortex.homepath import config_path, home_of, memory_dir
from opencortex.llm.settings import LLMSettings
from opencortex.memory.embedding_settings import MemorySettings
from opencortex.policy import ApprovalSettings
from opencortex.problems import describe
from opencortex.telemetry import TelemetrySettings
from opencortex.tools.mcp_settings import McpSettings
from opencortex.tools.settings import ToolSettings


def _bundled_root() -> Path:
    """The directory holding the bundled skills/, org/ and elisp/.

    An installed wheel carries them as package data in opencortex/bundled/ (see
    pyproject.toml); an editable install or a source tree runs the package from
    <checkout>/kernel/opencortex, and they are the checkout's own top-level directories."""
    package = Path(__file__).resolve().parent
    installed = package / "bundled"
    return installed if installed.is_dir() else package.parents[1]


BUNDLED_ROOT = _bundled_root()
BUNDLED_SKILLS = BUNDLED_ROOT / "skills"
BUNDLED_PERSONA = BUNDLED_ROOT / "org" / "identity.org"
BUNDLED_ELISP = BUNDLED_ROOT / "elisp"   # add to Emacs's load-path; `opencortex doctor` prints it
DEFAULT_CHAT_BUFFER = "*opencortex-chat*"


class ConfigError(ValueError):
    """The configuration file or an override is wrong; the message names it."""


class ChatSettings(BaseModel):
    """Settings the chat skill reads through its context."""

    model_config = ConfigDict(extra="forbid")

    buffer: str = DEFAULT_CHAT_BUFFER
    allowed_buffers: list[str] = Field(default_factory=list)
    history_chars: int = Field(default=1000, ge=100)
    show_thinking: bool = True  # the terminal shows a reasoning model's thinking, dim, as it comes


class ShellSettings(BaseModel):
    """How an approved shell command runs: no shell, a timeout, a scrubbed environment."""

    model_config = ConfigDict(extra="forbid")

    cwd: Path | None = None  # default: the home directory
    timeout: float = Field(default=60.0, gt=0)
    output_limit: int = Field(default=8000, ge=100)
    keep_env: list[str] = Field(default_factory=lambda: [
        "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "USER", "LOGNAME", "TZ"])


class EmacsSettings(BaseModel):
    """The EPC server Emacs talks to."""

    model_config = ConfigDict(extra="forbid")

    approval_timeout: float = Field(default=120.0, gt=0)
    max_payload_bytes: int = Field(default=4 << 20, ge=1024, le=15 << 20)
    call_timeout: float = Field(default=10.0, gt=0)
    auth_timeout: float = Field(default=5.0, gt=0, le=300)   # seconds to authenticate
    max_connections: int = Field(default=16, ge=1, le=1024)
    max_waiting_turns: int = Field(default=64, ge=1, le=4096)  # sent, not yet answered


class Config(BaseModel):
    """Everything the kernel needs to start, typed and checked."""

    model_config = ConfigDict(extra="forbid")

    home: Path
    config_file: Path | None = None
    backend: Literal["auto", "echo", "script", "anthropic", "openai"] = "auto"
    script: Path | None = None
    skill_dirs: list[Path] = Field(default_factory=list)
    bundled_skills: bool = True
    persona: Path | None = None
    max_rejections: int = Field(default=1, ge=0, le=10)
    max_reply_bytes: int = Field(default=1 << 20, ge=1024)
    max_reply_depth: int = Field(default=64, ge=4, le=512)
    max_reply_elements: int = Field(default=10_000, ge=100)  # atoms and lists in one reply
    llm_timeout: float = Field(default=120.0, gt=0)
    judge_timeout: float = Field(default=10.0, gt=0)  # reading + judging one reply, seconds
    prepare_timeout: float = Field(default=10.0, gt=0)  # recall + a skill's prompt, seconds
    stop_grace: float = Field(default=10.0, ge=0)  # seconds turns may take to finish on stop
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"  # serve's; see eventloop.py
    cpu: Literal["auto", "one", "any"] = "auto"   # serve's threads on one CPU; placement.py
    chat: ChatSettings = Field(default_factory=ChatSettings)
    shell: ShellSettings = Field(default_factory=ShellSettings)
    emacs: EmacsSettings = Field(default_factory=EmacsSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    conversation: ConversationSettings = Field(default_factory=ConversationSettings)
    bridges: BridgesSettings = Field(default_factory=BridgesSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    approvals: ApprovalSettings = Field(default_factory=ApprovalSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)

    @property
    def memory_dir(self) -> Path:
        return memory_dir(self.home)

    @property
    def all_skill_dirs(self) -> list[Path]:
        """Bundled skills first (when enabled), then the configured extra directories."""
        dirs = [BUNDLED_SKILLS] if self.bundled_skills and BUNDLED_SKILLS.is_dir() else []
        return dirs + [d for d in self.skill_dirs if d not in dirs]

    @property
    def persona_file(self) -> Path:
        return self.persona or BUNDLED_PERSONA


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML file at PATH as a table ({} when there is none); ConfigError naming the
    file when it is a directory, unreadable, not UTF-8 or not TOML."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a configuration file; remove it or "
                          "set OPENCORTEX_CONFIG to a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({error.strerror or error}); "
                          "fix its permissions") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {data[error.start]:#04x} at "
                          f"offset {error.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None


def _environment_overrides() -> dict[str, Any]:
    env = os.environ
    found: dict[str, Any] = {}
    if env.get("OPENCORTEX_BACKEND"):
        found["backend"] = env["OPENCORTEX_BACKEND"]
    if env.get("OPENCORTEX_SCRIPT"):
        found["script"] = env["OPENCORTEX_SCRIPT"]
    if env.get("OPENCORTEX_SKILL_DIRS"):
        found["skill_dirs"] = [p for p in env["OPENCORTEX_SKILL_DIRS"].split(os.pathsep) if p]
    if env.get("OPENCORTEX_PERSONA"):
        found["persona"] = env["OPENCORTEX_PERSONA"]
    return found


def _resolve_paths(fields: dict[str, Any], base: Path) -> None:
    """Relative paths in the file are relative to the file's directory."""
    def resolve(value: Any) -> Any:
        if not isinstance(value, (str, Path)) or not str(value):
            return value                  # not a path: validation names it
        path = Path(os.path.expanduser(str(value)))
        return path if path.is_absolute() else base / path
    for key in ("script", "persona"):
        if fields.get(key):
            fields[key] = resolve(fields[key])
    if isinstance(fields.get("skill_dirs"), list):
        fields["skill_dirs"] = [resolve(p) for p in fields["skill_dirs"]]
    tools = fields.get("tools")
    if isinstance(tools, dict):
        if isinstance(tools.get("roots"), list):
            tools["roots"] = [resolve(p) for p in tools["roots"]]
        for key in ("capture_file", "notes_file"):
            if tools.get(key):
                tools[key] = resolve(tools[key])


def load_config(home: Path | str | None = None, **overrides: Any) -> Config:
    """Read the TOML file, apply environment and OVERRIDES (None values ignored)."""
    home_path = Path(home).expanduser() if home is not None else None
    path = config_path(home_path)
    fields = _read_toml(path)
    _resolve_paths(fields, path.parent)
    env = _environment_overrides()
    _resolve_paths(env, Path.cwd())
    fields.update(env)
    if os.environ.get("OPENCORTEX_MODEL"):
        llm = fields.get("llm") if isinstance(fields.get("llm"), dict) else {}
        fields["llm"] = {**llm, "model": os.environ["OPENCORTEX_MODEL"]}
    given = {k: v for k, v in overrides.items() if v is not None}
    _resolve_paths(given, Path.cwd())
    fields.update(given)
    fields["home"] = home_of(home_path)
    fields["config_file"] = path if path.is_file() else None
    try:
        return Config.model_validate(fields)
    except ValidationError as error:
        problems = "; ".join(describe(error, noun="setting"))
        raise ConfigError(f"configuration ({path}): {problems}") from None
