"""The code the skill loader compiles, kept on disk and keyed by all it depends on.

Hy's own bytecode cache stays off for skill files (it would keep old macro
expansions after a helper's macro changes, and this machine sets
PYTHONDONTWRITEBYTECODE anyway), so the loader caches what it compiles itself.

What an entry holds: for every top-level form of a file, in order, the two code
objects `hy.eval` would run for it (its statements, then its last expression)
and the form's first line.  A hit runs them in order into the fresh module:
exactly the run-time effects of the compiled forms, as Hy's importer gives from a
`.pyc`, without reading or macro-expanding anything.  Reader macros and macros
defined in earlier blocks shaped the cached code when it was compiled, and their
run-time definitions (`defmacro`, `defreader`, `require`) run again on a hit, so
other code can still require them.  Code objects carry the file's name and org
line numbers, so errors and tracebacks from a hit name the same file:line.

The key is a sha256 of: the entry format, the Python version, bytecode magic
number and `-O` level, the Hy version, the file's path (it is in the code) and
text, and the text of every `.hy` and `.py` file of `opencortex/skills/` (the DSL
macros `defskill`/`deftool` and the loader's reading rules).  An entry also lists
the files of the macro modules present when it was compiled (every Hy module,
e.g. `_macros.hy` helpers and hyrule, and every module holding macros, outside
Hy itself and `opencortex/skills/`) with their sha256: a hit checks them, and a
changed or missing one is a miss.  So an edited skill, helper or DSL file is
compiled again.  Not covered: a macro whose expansion depends on a plain Python
module it calls at compile time, which changed since.

Not cached: a file whose compilation left a module-level name that its own
run-time code does not bind (`eval-when-compile`): from a cache that name would
be missing.  Other compile-time-only effects are as lost as with Hy's `.pyc`.

Entries live in HOME/cache/skills/ (0700), one file per skill file
(`<path hash>-<key>.bin`, 0600, written to a temporary file then renamed; an
older entry of the same file is removed).  An entry is the format tag, the
sha256 of its payload, then the marshalled payload: anything unreadable, short,
corrupt or of another shape is a miss, and the file is compiled and its entry
written again.  Writing problems are logged, never raised.  Entries are code the
kernel runs: they are as trusted as the home (and the skill files) themselves.

`OPENCORTEX_SKILL_CACHE=0` (or `off`, `no`, `false`) switches the cache off:
every file is compiled, nothing is read or written (to measure, or to rule the
cache out).
"""

from __future__ import annotations

import dis
import hashlib
import importlib.util
import logging
import marshal
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import hy
import hy.importer

from opencortex.files import replace_file

log = logging.getLogger(__name__)

SWITCH = "OPENCORTEX_SKILL_CACHE"
"""The environment variable that switches the cache off when 0, off, no or false."""

FORMAT = b"OCSKC\x00\x00\x01"
"""The first 8 bytes of an entry; a new layout gets a new tag."""

DSL_MODULE = "opencortex.skills.dsl"
"""The kernel's macros (`defskill`, `deftool`), loaded only to compile."""

KERNEL_SKILLS = Path(__file__).resolve().parent
HY_PACKAGE = Path(hy.__file__).resolve().parent
_DIGEST_BYTES = 32
_STORES = ("STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL")
_IGNORED = frozenset({"hy", "__builtins__", "_hy_macros", "_hy_reader_macros"})


@dataclass(frozen=True)
class CompiledForm:
    """One top-level form: its first line and the code `hy.eval` runs for it."""

    line: int
    body: CodeType
    expr: CodeType


@dataclass
class Recording:
    """What compiling one file produced, for the cache; `cacheable` False stops it."""

    forms: list[CompiledForm] = field(default_factory=list)
    cacheable: bool = True


def cache_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OPENCORTEX_SKILL_CACHE switch leaves the cache on (the default)."""
    return environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "no", "false")


_fingerprint: list[bytes] = []


def kernel_fingerprint() -> bytes:
    """sha256 of the `.hy` and `.py` files of opencortex/skills/.  Kept once the DSL
    macros are loaded (a hit never loads them), so it describes the macros this
    process compiles with even if the files change later."""
    if _fingerprint:
        return _fingerprint[0]
    digest = hashlib.sha256()
    for file in sorted(KERNEL_SKILLS.iterdir()):
        if file.suffix in (".hy", ".py") and file.is_file():
            _feed(digest, file.name.encode(), file.read_bytes())
    if DSL_MODULE in sys.modules:
        _fingerprint.append(digest.digest())
    return digest.digest()


def _feed(digest: Any, *parts: bytes) -> None:
    """Add PARTS to DIGEST, each with its length (so no two splits collide)."""
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)


def file_digest(path: str | Path) -> str:
    """sha256 (hex) of the file at PATH; OSError when it cannot be read."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CompileCache:
    """Compiled skill files in DIRECTORY (created 0700 when first written)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._write_failed = False                  # warned once, then quiet

    def key(self, path: Path, text: str) -> str:
        """The key of PATH holding TEXT under this Python, Hy and kernel."""
        digest = hashlib.sha256()
        _feed(digest, FORMAT, sys.version.encode(), importlib.util.MAGIC_NUMBER,
              str(sys.flags.optimize).encode(), hy.__version__.encode(),
              kernel_fingerprint(), str(path).encode(), text.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def entry_file(self, path: Path, key: str) -> Path:
        """Where the entry KEY of skill file PATH lives."""
        return self.directory / f"{_path_tag(path)}-{key}.bin"

    def load(self, path: Path, text: str) -> list[CompiledForm] | None:
        """The compiled forms of PATH holding TEXT, or None (a miss, whatever the reason)."""
        key = self.key(path, text)
        file = self.entry_file(path, key)
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.info("skill cache entry %s cannot be read (%s); compiling", file, err.strerror)
            return None
        payload = _payload(data, key)
        if payload is None:
            log.info("skill cache entry %s is unusable; compiling %s again", file, path)
            return None
        deps, forms = payload
        if not deps_unchanged(deps):
            return None
        return forms

    def store(self, path: Path, text: str, forms: Iterable[CompiledForm],
              deps: Mapping[str, str]) -> None:
        """Write the entry of PATH holding TEXT; a failure is logged, never raised."""
        key = self.key(path, text)
        rows = tuple((form.line, form.body, form.expr) for form in forms)
        try:
            payload = marshal.dumps((key, tuple(sorted(deps.items())), rows))
        except ValueError:
            log.info("skill file %s compiled to code that cannot be cached", path)
            return
        try:
            self._write(self.entry_file(path, key),
                        FORMAT + hashlib.sha256(payload).digest() + payload)
        except OSError as err:
            if not self._write_failed:
                log.warning("skill cache %s cannot be written (%s); skills load uncached",
                            self.directory, err.strerror)
            self._write_failed = True

    def _write(self, file: Path, data: bytes) -> None:
        """Write DATA to FILE (0600) through a temporary file; drop older entries of it."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(file, data, durable=False)      # a cache: a crash costs a compile
        tag = file.name.split("-", 1)[0]
        for old in self.directory.glob(f"{tag}-*.bin"):
            if old != file:
                old.unlink(missing_ok=True)


def _path_tag(path: Path) -> str:
    """A short name for skill file PATH, shared by all its entries."""
    return hashlib.sha256(str(path).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _payload(data: bytes, key: str) -> tuple[dict[str, str], list[CompiledForm]] | None:
    """The deps and forms of entry DATA for KEY, or None when it is not a sound entry."""
    head = len(FORMAT) + _DIGEST_BYTES
    if len(data) < head or not data.startswith(FORMAT):
        return None
    payload = data[head:]
    if hashlib.sha256(payload).digest() != data[len(FORMAT):head]:
        return None
    try:
        stored_key, deps, rows = marshal.loads(payload)
        forms = [CompiledForm(line, body, expr) for line, body, expr in rows]
        deps = {str(file): str(digest) for file, digest in deps}
    except (ValueError, TypeError, EOFError):
        return None
    if stored_key != key or not all(isinstance(f.line, int) and isinstance(f.body, CodeType)
                                    and isinstance(f.expr, CodeType) for f in forms):
        return None
    return deps, forms


def deps_unchanged(deps: Mapping[str, str]) -> bool:
    """Whether every file in DEPS still has the recorded sha256."""
    for file, digest in deps.items():
        try:
            if file_digest(file) != digest:
                return False
        except OSError:
            return False
    return True


def macro_files(modules: Mapping[str, Any], skip: Path, prefix: str) -> dict[str, str]:
    """File -> sha256 of the macro modules among MODULES: Hy modules and modules
    holding macros, except SKIP, modules named PREFIX…, and Hy's and the kernel's own."""
    found: dict[str, str] = {}
    for name, module in list(modules.items()):
        file = _macro_module_file(module)
        if file is None or name.startswith(prefix):
            continue
        resolved = Path(file).resolve()
        if resolved == skip.resolve() or resolved.is_relative_to(HY_PACKAGE) \
                or resolved.is_relative_to(KERNEL_SKILLS):
            continue
        try:
            found[file] = file_digest(file)
        except OSError:
            continue
    return found


def _macro_module_file(module: Any) -> str | None:
    """The file of MODULE if it is a Hy module or holds macros or reader macros."""
    try:
        namespace = vars(module)           # not getattr: no module __getattr__ runs
    except TypeError:
        return None
    file = namespace.get("__file__")
    if not isinstance(file, str) or not (
            isinstance(namespace.get("__loader__"), hy.importer.HyLoader)
            or "_hy_macros" in namespace or "_hy_reader_macros" in namespace):
        return None
    return file


def compile_form(form: Any, module: ModuleType, macros: Mapping[str, Any],
                 recording: Recording | None) -> CompiledForm:
    """Compile FORM for MODULE as `hy.eval` does (MACROS as its `macros`).

    With RECORDING, the form is added to it, and a compile-time-only binding of
    a module-level name (see the module doc) marks it not cacheable."""
    from hy.compiler import hy_compile          # what hy.eval calls (hy 1.x)
    before = dict(module.__dict__) if recording is not None else None
    tree, expr = hy_compile(form, module, get_expr=True, filename=form.filename,
                            source=form.source, import_stdlib=True, extra_macros=macros)
    compiled = CompiledForm(form.start_line, compile(tree, form.filename, "exec"),
                            compile(expr, form.filename, "eval"))
    if recording is not None:
        recording.forms.append(compiled)
        stored = stored_names(compiled)
        if stored is not None and not compile_time_names(before, module.__dict__) <= stored:
            recording.cacheable = False
    return compiled


def compile_time_names(before: Mapping[str, Any], after: Mapping[str, Any]) -> set[str]:
    """Module-level names compiling bound, rebound or deleted (Hy's own left out)."""
    changed = {name for name, value in after.items()
               if name not in before or before[name] is not value}
    changed |= set(before) - set(after)
    return changed - _IGNORED


def stored_names(form: CompiledForm) -> set[str] | None:
    """Module-level names FORM's code binds or deletes; None (any name) after `import *`."""
    names: set[str] = set()
    for code in (form.body, form.expr):
        for instruction in dis.get_instructions(code):
            if instruction.opname == "IMPORT_STAR":
                return None
            if instruction.opname in _STORES:
                names.add(instruction.argval)
    return names


_MISSING = object()


def run_form(module: ModuleType, form: CompiledForm) -> None:
    """Run FORM in MODULE's namespace as `hy.eval` does (keeping MODULE's `hy`)."""
    namespace = module.__dict__
    had = namespace.get("hy", _MISSING)
    try:
        exec(form.body, namespace)
        eval(form.expr, namespace)
    finally:
        if had is _MISSING:
            namespace.pop("hy", None)
        else:
            namespace["hy"] = had
