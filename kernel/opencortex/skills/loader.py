"""Load one skill file (`.hy`, or the Hy blocks of a literate `.org` note).

How a file runs:

- An `.org` note contributes its `#+begin_src hy` blocks (any case), in
  order; blocks with `:tangle no` are skipped and org's comma escapes
  (`,*`, `,#+`) are removed as org does when tangling.  Each block is read
  padded with newlines, so every form keeps its org line number.
- A `.hy` file is read whole.
- All code of a file is read with ONE shared `HyReader` (a reader macro
  defined in one block works in the next) and evaluated form by form with
  `hy.eval` into a fresh module that is in `sys.modules` before anything
  runs.  Forms carry the file name and text, so Hy errors and tracebacks
  name the real file and line.
- `defskill` is handed to every `hy.eval` as an extra macro, so skill files
  need no `(require ...)` of their own (an explicit one works too).
- Hy's bytecode cache is never used: a file is compiled from its source
  text, or, when the loader has a `CompileCache` (a registry given a cache
  directory), its compiled forms come from that cache, keyed by the text, the
  DSL macros and every macro file the compilation used (see
  `opencortex.skills.compile_cache`), so an edited file (or an edited macro in
  a helper it requires) always takes effect on the next load.

While a registry loads, `HelperFinder` lets skill code `require` or `import`
helper files (e.g. `_macros.hy`) that sit in the skill directories.

Every failure becomes one `SkillError` naming the file and, when known, the
line.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import hy
import hy.importer
from hy.errors import HyLanguageError

from opencortex.skills.compile_cache import (
    CompiledForm, CompileCache, Recording, compile_form, macro_files, run_form)
from opencortex.skills.skill import DefskillError, Skill
from opencortex.tools.define import DeftoolError

SKILL_MODULE_PREFIX = "opencortex_skill_"
"""Skill files load as modules named `opencortex_skill_<stem>_<n>`."""

_BEGIN_HY = re.compile(r"[ \t]*#\+begin_src[ \t]+hy(?:[ \t]+(?P<args>.*))?", re.I)
_BEGIN_ANY = re.compile(r"[ \t]*#\+begin_src\b", re.I)
_END = re.compile(r"[ \t]*#\+end_src[ \t]*", re.I)
_TANGLE_NO = re.compile(r"(?:^|\s):tangle\s+\"?no\"?(?:\s|$)", re.I)
_ORG_COMMA = re.compile(r"^([ \t]*),(?=,*(?:\*|#\+))")


class SkillError(Exception):
    """A skill file could not be loaded.  str() is "path:line: message"."""

    def __init__(self, path: Path, line: int | None, message: str):
        self.path = Path(path)
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class CodeBlock:
    """Hy code from a file; `line` is the file line of its first code line."""

    line: int
    text: str


def org_code_blocks(path: Path, text: str) -> list[CodeBlock]:
    """The Hy source blocks of org TEXT, in order, without `:tangle no` ones."""
    blocks: list[CodeBlock] = []
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        begin = _BEGIN_HY.fullmatch(lines[number].rstrip("\r"))
        number += 1
        if begin is None:
            if _BEGIN_ANY.match(lines[number - 1]):
                number = _skip_block(lines, number)
            continue
        start = number
        while number < len(lines) and not _END.fullmatch(lines[number].rstrip("\r")):
            number += 1
        if number == len(lines):
            raise SkillError(path, start, "this #+begin_src hy block has no "
                             "#+end_src; close it with a #+end_src line")
        if not _TANGLE_NO.search(begin["args"] or ""):
            code = "\n".join(_ORG_COMMA.sub(r"\1", line) for line in lines[start:number])
            blocks.append(CodeBlock(start + 1, code))
        number += 1
    return blocks


def _skip_block(lines: list[str], number: int) -> int:
    """Index just past the #+end_src closing a non-Hy block (or the end)."""
    while number < len(lines) and not _END.fullmatch(lines[number].rstrip("\r")):
        number += 1
    return number + 1


def code_blocks(path: Path, text: str) -> list[CodeBlock]:
    """The Hy code of a skill file: org blocks for `.org`, else the whole text."""
    if path.suffix.lower() == ".org":
        return org_code_blocks(path, text)
    return [CodeBlock(1, text)]


class SkillLoader(hy.importer.HyLoader):
    """Runs a skill or helper file from its source text, form by form (or from CACHE)."""

    def __init__(self, fullname: str, path: str, cache: CompileCache | None = None):
        super().__init__(fullname, path)
        self.cache = cache

    def exec_module(self, module: ModuleType) -> None:
        """Evaluate the file's Hy code into MODULE; raise SkillError on failure."""
        path = Path(self.path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise SkillError(path, None, f"not valid UTF-8 ({err.reason} at byte "
                             f"{err.start}); save the file as UTF-8") from None
        except OSError as err:
            raise SkillError(path, None, f"cannot read the file: {err.strerror}") from None
        module.hy = hy           # as in any Hy module; hy.eval keeps it when present
        run_file(module, path, text, self.cache)

    def get_code(self, fullname):
        """Skill files never have bytecode; `exec_module` works from source."""
        return None


def run_file(module: ModuleType, path: Path, text: str, cache: CompileCache | None) -> None:
    """Run PATH (holding TEXT) into MODULE: from CACHE on a hit, else compiled form by
    form, and then stored in CACHE when it loaded and may be cached."""
    cached = cache.load(path, text) if cache is not None else None
    if cached is not None:
        run_cached(module, path, cached)
        return
    recording = Recording() if cache is not None else None
    run_code(module, path, text, code_blocks(path, text), recording)
    if cache is not None and recording.cacheable:
        cache.store(path, text, recording.forms,
                    macro_files(sys.modules, path, SKILL_MODULE_PREFIX))


def run_cached(module: ModuleType, path: Path, forms: Sequence[CompiledForm]) -> None:
    """Run the cached compiled FORMS of PATH into MODULE, in order."""
    line = None
    try:
        for form in forms:
            line = form.line
            run_form(module, form)
    except (Exception, SystemExit) as err:
        error = skill_error(err, path, line)
        if error is err:
            raise
        raise error from err


def run_code(module: ModuleType, path: Path, text: str, blocks: Sequence[CodeBlock],
             recording: Recording | None = None) -> None:
    """Read BLOCKS with one shared reader and evaluate each form into MODULE (as
    `hy.eval` would), adding the compiled forms to RECORDING when given."""
    from opencortex.skills.dsl import SKILL_MACROS   # compiling dsl.hy costs ~70 ms: not on a hit
    reader = hy.HyReader()
    form = None
    try:
        for block in blocks:
            padded = "\n" * (block.line - 1) + block.text
            done = (block.line, 0)
            try:
                for form in hy.read_many(padded, filename=str(path), reader=reader):
                    form.filename, form.source = str(path), text
                    run_form(module, compile_form(form, module, SKILL_MACROS, recording))
                    done = (form.end_line, form.end_column)
            except hy.PrematureEndOfInput as err:
                if err.filename != str(path):
                    raise
                raise SkillError(path, unclosed_form_line(padded, done), (
                    f"this form is not closed (the code ended at line {err.lineno}); "
                    f"check for a missing `)`, `]`, `}}` or `\"`")) from None
    except (Exception, SystemExit) as err:
        error = skill_error(err, path, getattr(form, "start_line", None))
        if error is err:
            raise
        raise error from err


def unclosed_form_line(code: str, after: tuple[int, int]) -> int:
    """Line of the first form in CODE that starts after (line, column) AFTER."""
    line, column = after
    lines = code.split("\n")
    for number in range(line, len(lines) + 1):
        rest = lines[number - 1][column if number == line else 0:]
        if rest.split(";", 1)[0].strip():
            return number
    return line


def skill_error(err: BaseException, path: Path, fallback_line: int | None) -> SkillError:
    """Turn ERR, raised while loading PATH, into a SkillError at the best line."""
    helper = _helper_error(err)
    if helper is not None:
        if helper.path == path:
            return helper
        return SkillError(path, fallback_line, f"a required helper failed to load: {helper}")
    if isinstance(err, HyLanguageError):
        line = err.lineno if err.filename == str(path) else fallback_line
        return SkillError(path, line, _hy_message(err))
    if isinstance(err, (DefskillError, DeftoolError)):
        return SkillError(path, err.line or fallback_line, str(err))
    line = None
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        if frame.f_code.co_filename == str(path):
            line = lineno
    return SkillError(path, line or fallback_line, f"{type(err).__name__}: {err}")


def _hy_message(err: HyLanguageError) -> str:
    """A one-line message for a Hy reader or compiler error."""
    first, *rest = [part.strip() for part in str(err.msg).splitlines() if part.strip()] or [""]
    if first.startswith("expanding macro ") and rest:
        first = f"in macro {first.removeprefix('expanding macro ')}:"
    return " ".join([first, *rest])


def _helper_error(err: BaseException) -> SkillError | None:
    """The SkillError of a helper file somewhere in ERR's chain, if any."""
    seen = 0
    while err is not None and seen < 50:
        if isinstance(err, SkillError):
            return err
        err = err.__cause__ or err.__context__
        seen += 1
    return None


def load_module(path: Path, name: str, cache: CompileCache | None = None) -> ModuleType:
    """Load the skill file PATH as a fresh module NAME (kept in sys.modules), through
    CACHE when given."""
    loader = SkillLoader(name, str(path), cache)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    spec.cached = None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def skills_in(module: ModuleType) -> list[Skill]:
    """The skills MODULE itself defines (not ones it imported), in definition order."""
    return [value for value in vars(module).values()
            if isinstance(value, Skill) and value.module == module.__name__]


class HelperFinder(importlib.abc.MetaPathFinder):
    """Finds helper Hy files in the skill directories for `require`/`import`.

    `(require _macros [shout])` loads `_macros.hy` from the first skill
    directory that has it.  Only top-level names are served.  Names starting
    with `_` are always served from the skill directories; other names only
    when no other finder provides them, so a skill file never shadows an
    installed module.  Place this finder first on `sys.meta_path`.
    """

    def __init__(self, directories: Sequence[Path], cache: CompileCache | None = None):
        self.directories = list(directories)
        self.cache = cache

    def find_spec(self, fullname, path=None, target=None):
        """A spec for helper FULLNAME if a skill directory has it."""
        if path is not None or "." in fullname:
            return None
        files = helper_files(self.directories, fullname)
        if not files or (not fullname.startswith("_") and self._found_elsewhere(fullname)):
            return None
        loader = SkillLoader(fullname, str(files[0]), self.cache)
        spec = importlib.util.spec_from_file_location(fullname, files[0], loader=loader)
        spec.cached = None
        return spec

    def _found_elsewhere(self, fullname: str) -> bool:
        """Whether another finder on sys.meta_path provides FULLNAME."""
        return any(finder.find_spec(fullname, None) is not None
                   for finder in list(sys.meta_path)
                   if finder is not self and hasattr(finder, "find_spec"))


def helper_files(directories: Sequence[Path], name: str) -> list[Path]:
    """Files in DIRECTORIES that module NAME (mangled or not) would load."""
    stems = dict.fromkeys([name, hy.unmangle(name)])
    return [d / f"{stem}.hy" for d in directories for stem in stems
            if (d / f"{stem}.hy").is_file()]


def forget_helpers(directories: Sequence[Path]) -> list[str]:
    """Drop the helper modules of DIRECTORIES from sys.modules.

    Dropped: modules a SkillLoader made from a file in DIRECTORIES (even if
    the file is gone since), and ones named like a `.hy` file there (a
    same-named helper of another skill directory).  Installed modules are
    never dropped.  The next `require` then reads the helper from disk.
    Returns the names dropped.
    """
    homes = set(directories)
    names = {name for d in directories if d.is_dir() for file in d.glob("*.hy")
             for name in (file.stem, hy.mangle(file.stem))}
    dropped = [name for name, module in list(sys.modules.items())
               if isinstance(getattr(module, "__loader__", None), SkillLoader)
               and not name.startswith(SKILL_MODULE_PREFIX)
               and (name in names or Path(module.__loader__.path).parent in homes)]
    for name in dropped:
        del sys.modules[name]
    return dropped
