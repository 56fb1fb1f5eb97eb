"""What is present and missing on this machine, each with the fix."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opencortex.config import Config


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False


PYTHON_DEPS = (("hy", "hy"), ("hyrule", "hyrule"), ("sexpdata", "sexpdata"),
               ("orgparse", "orgparse"), ("pydantic", "pydantic"), ("epc", "epc"),
               ("anthropic", "anthropic"), ("openai", "openai"))


def _python_dependency(module: str, distribution: str) -> Check:
    try:
        importlib.import_module(module)
        version = importlib.metadata.version(distribution)
    except Exception as error:
        return Check(f"python: {distribution}", False, f"cannot import ({type(error).__name__})",
                     "pip install -e . (from the opencortex checkout)")
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


def _keys() -> list[Check]:
    checks = []
    for variable in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        present = bool(os.environ.get(variable))
        checks.append(Check(f"key: {variable}", present, "set" if present else "not set",
                            f"export {variable}=… to use that provider; without a key the "
                            "kernel runs the offline echo backend", optional=True))
    return checks


def _skills(config: Config) -> Check:
    from opencortex.runtime import load_skills
    registry = load_skills(config)
    if registry.errors:
        return Check("skills", False, "; ".join(str(e) for e in registry.errors),
                     "fix the file and line named, then run `opencortex skills --check`")
    names = ", ".join(s.name for s in registry.skills) or "none"
    if not registry.skills:
        return Check("skills", False, "no skills loaded",
                     "add skill_dirs to the configuration or keep the bundled skills/")
    return Check("skills", True, names)


def run_checks(config: Config) -> list[Check]:
    checks = [_python_dependency(m, d) for m, d in PYTHON_DEPS]
    checks.append(_writable("home", config.home))
    checks.append(_writable("memory", config.memory_dir))
    checks.append(Check("config file", True, str(config.config_file or "none (defaults)")))
    persona = config.persona_file
    checks.append(Check("persona", persona.is_file(), str(persona),
                        "create the note or set `persona` in the configuration", optional=True))
    checks.append(_skills(config))
    checks.extend(_emacs())
    checks.extend(_keys())
    return checks
