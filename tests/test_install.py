"""Installing like real software: the wheel carries the bundled skills, persona note and
Emacs package and runs from a fresh virtual environment; kernel/install.sh is quick and
silent when the project venv is set up, and says what is wrong when it cannot be.

The wheel is built offline with hatchling (the `test` extra installs it) from an sdist,
as pip does from PyPI, and installed with `--no-deps --no-index` into a venv that sees
the dependencies already installed here."""

from __future__ import annotations

import email.parser
import hashlib
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import opencortex

REPO = Path(__file__).resolve().parents[1]
BUNDLED = ("skills", "org", "elisp")   # top-level directories the wheel carries
TIMEOUT = 180                          # seconds for any one subprocess

if importlib.util.find_spec("hatchling") is None:
    if os.environ.get("CI"):
        raise RuntimeError("hatchling is missing: bash tests/run.sh installs it (`test` extra)")
    pytest.skip("hatchling is not installed (bash tests/run.sh installs it)", allow_module_level=True)


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    if check:
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def hatch(hook: str, source: Path, out: Path) -> Path:
    """Build with hatchling's PEP 517 hook HOOK from SOURCE into OUT (offline)."""
    code = f"import sys, hatchling.build as b; print(b.{hook}(sys.argv[1]))"
    name = run(sys.executable, "-c", code, out, cwd=source).stdout.strip()
    return out / name


def clean_env(tmp: Path) -> dict[str, str]:
    """The environment without keys or opencortex settings, state under TMP."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENCORTEX_", "PYTHON", "VIRTUAL_ENV"))
           and k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env.update(XDG_DATA_HOME=str(tmp / "xdg-data"), XDG_CONFIG_HOME=str(tmp / "xdg-config"),
               PYTHONDONTWRITEBYTECODE="1")
    return env


def make_venv(path: Path) -> Path:
    """A venv at PATH without pip that sees the packages installed for this Python: the
    base installation's (--system-site-packages) and, when the tests run in a venv (.venv),
    that venv's, after its own. Returns its python."""
    run(sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", path, cwd=path.parent)
    python = path / "bin" / "python"
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                  cwd=path).stdout.strip()
    # Plain paths: their own .pth files (an editable opencortex) are not processed.
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "zz_outer_site.pth").write_text("".join(f"{p}\n" for p in outer))
    return python


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the sdist of this checkout (as pip builds one from PyPI)."""
    out = tmp_path_factory.mktemp("dist")
    sdist = hatch("build_sdist", REPO, out)
    with tarfile.open(sdist) as archive:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(out / "sdist", **safe)
    (unpacked,) = (out / "sdist").iterdir()
    (out / "wheel").mkdir()
    return hatch("build_wheel", unpacked, out / "wheel")


@pytest.fixture(scope="module")
def direct_wheel(tmp_path_factory) -> Path:
    """The wheel built straight from the checkout (what `pip install .` does)."""
    return hatch("build_wheel", REPO, tmp_path_factory.mktemp("direct"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its directory."""
    path = tmp_path_factory.mktemp("install") / "venv"
    python = make_venv(path)
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        "--disable-pip-version-check", "-q", wheel, cwd=path.parent)
    return path


def installed_package(venv: Path) -> dict:
    code = ("import json, opencortex, opencortex.config as c\n"
            "print(json.dumps({'file': opencortex.__file__, 'version': opencortex.__version__,"
            " 'skills': str(c.BUNDLED_SKILLS), 'persona': str(c.BUNDLED_PERSONA),"
            " 'elisp': str(c.BUNDLED_ELISP)}))")
    return json.loads(run(venv / "bin" / "python", "-c", code, cwd=venv.parent,
                          env=clean_env(venv.parent)).stdout)


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_wheel_holds_the_package_and_the_bundled_files(wheel, direct_wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    with zipfile.ZipFile(direct_wheel) as archive:
        assert set(archive.namelist()) == names, "the sdist lacks files the checkout has"
    package = REPO / "kernel" / "opencortex"
    sources = {f"opencortex/{p.relative_to(package)}" for p in package.rglob("*")
               if p.suffix in (".py", ".hy") and "__pycache__" not in p.parts}
    assert sources <= names, f"missing from the wheel: {sorted(sources - names)}"
    for directory in BUNDLED:
        for name in files_under(REPO / directory):
            assert f"opencortex/bundled/{directory}/{name}" in names
    assert {n.split("/")[0] for n in names} == {
        "opencortex", f"opencortex_kernel-{opencortex.__version__}.dist-info"}


def test_the_metadata_is_fit_for_an_index(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(meta).decode())
        (points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(points).decode()
    assert metadata["Name"] == "opencortex-kernel"
    assert metadata["Version"] == opencortex.__version__
    assert metadata["License-Expression"] == "GPL-3.0-or-later"
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Summary"] and metadata["Author"] and metadata["Keywords"]
    assert "opencortex is a Python kernel" in metadata.get_payload()   # README.org
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Topic :: Text Editors :: Emacs" in classifiers
    requires = metadata.get_all("Requires-Dist")
    for name in ("hy", "sexpdata==1.0.2", "pydantic", "epc==0.0.5", "prompt-toolkit"):
        assert any(r.startswith(name) for r in requires), name
    assert "opencortex = opencortex.cli:main" in entry_points


def test_the_installed_package_shadows_the_checkout_and_finds_its_bundled_files(venv):
    found = installed_package(venv)
    assert Path(found["file"]).is_relative_to(venv), found
    assert found["version"] == opencortex.__version__
    bundled = Path(found["file"]).parent / "bundled"
    assert Path(found["skills"]) == bundled / "skills"
    assert Path(found["persona"]) == bundled / "org" / "identity.org"
    assert Path(found["elisp"]) == bundled / "elisp"
    for directory in BUNDLED:
        assert files_under(bundled / directory) == files_under(REPO / directory), directory


def test_a_turn_skills_version_and_doctor_run_from_the_installed_program(venv):
    program, env, home = venv / "bin" / "opencortex", clean_env(venv.parent), venv.parent / "home"
    turn = json.loads(run(program, "chat", "-m", "hi", "--json", "--home", home, cwd=home.parent,
                          env=env).stdout)
    assert turn["status"] == "done", turn
    assert turn["skill"] == "chat" and turn["backend"] == "echo"
    assert any("echo mode" in warning for warning in turn["warnings"]), turn["warnings"]
    assert not any("cannot be read" in w for w in turn["warnings"] + turn["errors"]), turn

    skills = json.loads(run(program, "skills", "--json", "--home", home, cwd=home.parent,
                            env=env).stdout)
    assert "chat" in [s["name"] for s in skills["skills"]] and not skills["errors"], skills

    version = run(program, "--version", cwd=home.parent, env=env).stdout
    assert version.strip() == f"opencortex {opencortex.__version__}"

    doctor = run(program, "doctor", "--home", home, cwd=home.parent, env=env).stdout
    bundled = Path(installed_package(venv)["file"]).parent / "bundled"
    shipped = sorted(f.name for f in (REPO / "skills").iterdir() if f.suffix == ".org")
    assert f"ok  bundled skills: {bundled / 'skills'} ({', '.join(shipped)})" in doctor, doctor
    assert f"ok  bundled persona: {bundled / 'org' / 'identity.org'}" in doctor, doctor
    assert f"ok  emacs package: {bundled / 'elisp'}" in doctor, doctor


@pytest.mark.skipif(shutil.which("emacs") is None, reason="no Emacs here")
def test_emacs_loads_the_installed_elisp(venv, tmp_path):
    elisp = Path(installed_package(venv)["elisp"])
    done = run("emacs", "--batch", "-L", elisp,
               "--eval", "(progn (package-initialize) (require 'opencortex))",
               "--eval", "(princ (file-name-directory (locate-library \"opencortex\")))",
               cwd=tmp_path, env=clean_env(tmp_path), check=False)
    if done.returncode != 0 and "epc" in done.stderr:
        pytest.skip("epc.el is not installed (apt-get install elpa-epc)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == elisp


# -- kernel/install.sh ----------------------------------------------------------------


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of what kernel/install.sh reads: pyproject.toml and the script itself."""
    root = tmp_path / "checkout"
    (root / "kernel").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copy(REPO / "kernel" / "install.sh", root / "kernel")
    return root.resolve()


def install(root: Path, *extras: str, **env: str) -> subprocess.CompletedProcess:
    return run("bash", root / "kernel" / "install.sh", *extras, cwd=root.parent,
               env={**clean_env(root.parent), **env}, check=False)


def project_venv(root: Path) -> None:
    """ROOT/.venv that works without network: opencortex from this checkout's kernel/."""
    python = make_venv(root / ".venv")
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                  cwd=root).stdout.strip()
    (Path(purelib) / "opencortex_checkout.pth").write_text(f"{REPO / 'kernel'}\n")


def stamp(root: Path, extras: str) -> None:
    key = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv" / ".opencortex-install").write_text(f"{key} {root}\n{extras}\n")


def test_install_does_nothing_when_already_installed(checkout):
    project_venv(checkout)
    stamp(checkout, "test")
    for extras in ((), ("test",)):
        done = install(checkout, *extras)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done


def test_install_refuses_an_unknown_extra_without_installing(checkout):
    project_venv(checkout)
    stamp(checkout, "test")
    done = install(checkout, "no-such-extra")
    assert done.returncode == 1
    assert "pyproject.toml has no extra 'no-such-extra' (it has: " in done.stderr
    assert "test" in done.stderr.splitlines()[-1]
    assert (checkout / ".venv" / ".opencortex-install").read_text().endswith("\ntest\n")
    done = install(checkout, "a;b")
    assert done.returncode == 1 and "not an extra name: 'a;b'" in done.stderr


def test_install_names_the_python_it_needs(checkout, tmp_path):
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\n"
                   "case \"$2\" in *print*) echo 3.10 ;; *) exit 1 ;; esac\n")
    old.chmod(0o755)
    done = install(checkout, PYTHON=str(old))
    assert done.returncode == 1
    assert f"opencortex needs Python 3.11 or newer; {old} is 3.10" in done.stderr
    assert "PYTHON=python3.11 bash kernel/install.sh" in done.stderr
    assert not (checkout / ".venv").exists()
    done = install(checkout, PYTHON=str(tmp_path / "no-such-python"))
    assert done.returncode == 1 and "no " in done.stderr and "Python 3.11 or newer" in done.stderr
