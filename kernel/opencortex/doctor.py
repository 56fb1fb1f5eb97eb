"""What is present and missing on this machine, each with the fix."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from opencortex.config import BUNDLED_ELISP, BUNDLED_PERSONA, BUNDLED_SKILLS, Config

SERVER_TIMEOUT = 3.0   # seconds the configured LLM server has to answer GET /models


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False


PYTHON_DEPS = (("hy", "hy"), ("hyrule", "hyrule"), ("sexpdata", "sexpdata"),
               ("orgparse", "orgparse"), ("pydantic", "pydantic"), ("epc", "epc"),
               ("prompt_toolkit", "prompt-toolkit"), ("anthropic", "anthropic"),
               ("openai", "openai"))

REINSTALL = ("reinstall opencortex: `bash kernel/install.sh` in a checkout, else "
             "`pip install --force-reinstall opencortex-kernel`")


def _python_dependency(module: str, distribution: str) -> Check:
    try:
        importlib.import_module(module)
        version = importlib.metadata.version(distribution)
    except Exception as error:
        return Check(f"python: {distribution}", False, f"cannot import ({type(error).__name__})",
                     REINSTALL)
    if distribution == "sexpdata" and version != "1.0.2":
        return Check("python: sexpdata", False, f"version {version}; opencortex needs 1.0.2",
                     "pip install sexpdata==1.0.2")
    return Check(f"python: {distribution}", True, version)


def _writable(name: str, path: Path) -> Check:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
        return Check(name, True, str(path))
    except OSError as error:
        return Check(name, False, f"{path}: {error.strerror}",
                     f"make {path} writable, or pass --home DIR / set OPENCORTEX_HOME")


def _emacs() -> list[Check]:
    emacs = shutil.which("emacs")
    if emacs is None:
        return [Check("emacs", False, "not found", "apt-get install emacs-nox (or your OS's Emacs)",
                      optional=True)]
    checks = [Check("emacs", True, emacs)]
    try:
        run = subprocess.run([emacs, "--batch", "--eval", "(progn (package-initialize) (require 'epc))"],
                             capture_output=True, timeout=30, check=False)
        found = run.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        found = False
    checks.append(Check("emacs: epc.el", found, "loadable" if found else "not loadable",
                        "apt-get install elpa-epc, or M-x package-install RET epc (MELPA)",
                        optional=True))
    return checks


def _openai_url(config: Config) -> str | None:
    """The OpenAI-compatible server the configuration names (setting, else
    $OPENAI_BASE_URL), or None when none is configured."""
    return config.llm.openai.base_url or os.environ.get("OPENAI_BASE_URL") or None


def _keys(config: Config) -> list[Check]:
    """Provider keys; without any (and without a server) the kernel runs echo."""
    server = _openai_url(config)
    otherwise = (f"; without it the kernel uses the server at {server}" if server
                 else "; without a key the kernel runs the offline echo backend")
    checks = []
    for variable in (config.llm.anthropic.api_key_env, config.llm.openai.api_key_env):
        present = bool(os.environ.get(variable))
        detail = "set" if present else "not set"
        if not present and server and variable == config.llm.openai.api_key_env:
            detail = f"not set (the server at {server} is used without one)"
        checks.append(Check(f"key: {variable}", present, detail,
                            f"export {variable}=… to use that provider{otherwise}",
                            optional=True))
    return checks


def _openai_server(config: Config, timeout: float = SERVER_TIMEOUT) -> Check | None:
    """Whether the configured OpenAI-compatible server answers GET {base_url}/models."""
    url = _openai_url(config)
    if url is None:
        return None
    name, fix = f"llm server {url}", ("start the server, or fix `base_url` under [llm.openai] "
                                      "(or $OPENAI_BASE_URL); it usually ends in /v1")
    request = urllib.request.Request(url.rstrip("/") + "/models")
    key = os.environ.get(config.llm.openai.api_key_env)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError as error:
        detail = f"answers, but GET /models gave HTTP {error.code}"
        if error.code in (401, 403):
            fix = f"set {config.llm.openai.api_key_env} to a key this server accepts"
        return Check(name, False, detail, fix)
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        return Check(name, False, f"does not answer ({reason})", fix)
    return Check(name, True, f"answers ({_model_count(body)})")


def _model_count(body: bytes) -> str:
    """How many models a /models answer lists, in words."""
    try:
        models = json.loads(body).get("data")
    except (ValueError, AttributeError, RecursionError):
        return "not a model list"
    return f"{len(models)} models" if isinstance(models, list) else "not a model list"


def _bundled() -> list[Check]:
    """The skills, persona note and Emacs package that ship with opencortex."""
    skills = sorted(file.name for file in BUNDLED_SKILLS.glob("*")
                    if file.suffix.lower() in (".org", ".hy"))
    elisp = BUNDLED_ELISP / "opencortex.el"
    return [
        Check("bundled skills", bool(skills),
              f"{BUNDLED_SKILLS} ({', '.join(skills)})" if skills else f"{BUNDLED_SKILLS}: none",
              REINSTALL),
        Check("bundled persona", BUNDLED_PERSONA.is_file(),
              str(BUNDLED_PERSONA) if BUNDLED_PERSONA.is_file() else f"{BUNDLED_PERSONA}: missing",
              REINSTALL),
        Check("emacs package", elisp.is_file(),
              f"{BUNDLED_ELISP} (put this directory on Emacs's load-path)" if elisp.is_file()
              else f"{elisp}: missing", REINSTALL),
    ]


def _skills(config: Config) -> Check:
    from opencortex.runtime import load_skills
    from opencortex.skills.skillmd import SkillWarning
    registry = load_skills(config)
    broken = [e for e in registry.errors if not isinstance(e, SkillWarning)]
    if broken:
        return Check("skills", False, "; ".join(str(e) for e in broken),
                     "fix the file and line named, then run `opencortex skills --check`")
    names = ", ".join(s.name for s in registry.skills) or "none"
    documents = registry.docs.catalogue()
    names += (f"; SKILL.md: {', '.join(documents)}" if documents else "") + \
        f"; {len(registry.tool_registry.all())} tools"
    if not registry.skills:
        return Check("skills", False, "no skills loaded",
                     "add skill_dirs to the configuration or keep the bundled skills/")
    return Check("skills", True, names)


def _event_loop(config: Config) -> Check:
    """The loop `serve` will run on (see opencortex.eventloop)."""
    from opencortex.eventloop import EventLoopUnavailable, loop_factory
    if config.event_loop == "asyncio":
        return Check("event loop", True, 'asyncio\'s own (event_loop = "asyncio")')
    try:
        factory = loop_factory(config.event_loop)
    except EventLoopUnavailable as error:
        return Check("event loop", False, str(error), "pip install uvloop")
    if factory is None:
        return Check("event loop", False, "asyncio's own: uvloop is not installed (about 10% "
                     "more CPU a turn under load)", REINSTALL, optional=True)
    return Check("event loop", True, f"uvloop {importlib.metadata.version('uvloop')}")


def _cpu(config: Config) -> Check:
    """Where serve's threads will run (see opencortex.placement)."""
    from opencortex.placement import PLACEMENT, on_one_cpu
    setting = f'cpu = "{config.cpu}"'
    if not on_one_cpu(config):
        why = "an embedding model runs in the kernel; " if config.cpu == "auto" else ""
        return Check("cpu", True, f"serve: its threads on any CPU ({why}{setting})")
    if len(PLACEMENT.allowed) < 2:
        return Check("cpu", True, f"serve: one CPU to use ({setting})")
    return Check("cpu", True, f"serve: its threads together on one CPU of "
                 f"{len(PLACEMENT.allowed)}, moved when other work keeps it busy ({setting})")


def _archive_writes(config: Config) -> Check:
    """Where serve writes the archive's files (see opencortex.memory.write_process)."""
    if not config.memory.write_process:
        return Check("archive writes", True, "in the writer thread ([memory] write_process "
                     "= true: by a process of their own)")
    return Check("archive writes", True, "serve: in a process of its own (the writer thread "
                 "when it cannot start; /metrics shows which)")


def _recall(config: Config) -> Check:
    """How recall ranks: lexical, or lexical + dense when a model is configured and loads."""
    stemmer = config.memory.stemmer
    stemming = {"porter": "porter stemming", "none": "no stemming ([memory] stemmer)"}.get(
        stemmer, f"Snowball stemming ({stemmer})")
    lexical = f"per-owner FTS5 with {stemming} and dates"
    model = config.memory.embeddings.model
    if model is None:
        return Check("recall", True, f"lexical: {lexical} (no embedding model: dense recall "
                     "is not available)")
    from opencortex.memory.embedders import Embedder, EmbedderError
    try:
        [vector] = Embedder(model).embed(["opencortex doctor: a test sentence"])
    except EmbedderError as error:
        cause = error.__cause__
        detail = "" if cause is None or str(cause) in str(error) else \
            f" ({type(cause).__name__}: {cause})"
        return Check("recall", False, f"lexical only: {error}{detail}",
                     "fix [memory.embeddings] model (a local model directory, or "
                     "python:package.module:function), or remove it for lexical recall")
    return Check("recall", True, f"lexical + dense ({model}, {len(vector)} dimensions), "
                 f"fused by RRF; lexical: {lexical}")


def _mcp_server(name: str, program: str) -> Check:
    """Whether the program of MCP server NAME can be found (it starts with the kernel)."""
    found = shutil.which(program)
    return Check(f"mcp server {name}", found is not None, found or f"{program}: not found",
                 "install it or give its full path in [mcp.servers.NAME] command")


def run_checks(config: Config) -> list[Check]:
    checks = [_python_dependency(m, d) for m, d in PYTHON_DEPS]
    checks.append(_writable("home", config.home))
    checks.append(_writable("memory", config.memory_dir))
    checks.append(Check("config file", True, str(config.config_file or "none (defaults)")))
    checks.extend(_mcp_server(name, server.command[0])
                  for name, server in config.mcp.servers.items())
    checks.append(_event_loop(config))
    checks.append(_cpu(config))
    checks.append(_archive_writes(config))
    checks.append(_recall(config))
    checks.extend(_bundled())
    persona = config.persona_file
    checks.append(Check("persona", persona.is_file(), str(persona),
                        "create the note or set `persona` in the configuration", optional=True))
    checks.append(_skills(config))
    checks.extend(_emacs())
    server = _openai_server(config)
    if server is not None:
        checks.append(server)
    checks.extend(_keys(config))
    checks.extend(_bridges(config))
    return checks


def _bridges(config: Config) -> list[Check]:
    """Each enabled bridge: its token or password is present and the platform answers."""
    import asyncio
    from opencortex.bridges.runner import check_bridge
    checks = []
    for name, settings in config.bridges.enabled().items():
        ok, detail, fix = asyncio.run(check_bridge(name, settings, home=config.home))
        checks.append(Check(f"bridge: {name}", ok, detail, fix))
    return checks
