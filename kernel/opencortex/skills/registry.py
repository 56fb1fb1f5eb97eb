"""The set of loaded skills: load directories, order by priority, reload.

Each load is a new generation: every skill file becomes a fresh module
named `opencortex_skill_<stem>_<n>` (n unique per process), the previous
generation's modules and helper modules leave `sys.modules`, and files
are compiled from source again (or, with a `cache_dir`, taken from the
compile cache when nothing they depend on changed: see `compile_cache`).
Within a directory, files load in sorted file-name order; directories
load in the order given.  `.org` and `.hy` files are skills; names
starting with `_` or `.` are not (a `_name.hy` helper loads only when a
skill requires or imports it, fresh each generation).  A folder holding
`SKILL.md` is a SKILL.md skill (see `skillmd`): those load into `docs`
beside the Hy skills, and the `skill-load` tool that reads them becomes
the "skill-docs" tool group.
A missing directory is skipped (nothing to load); a broken
file is reported as a SkillError and skipped while the others load.  When
two files define a skill of the same name, the first one loaded wins and
the second is reported.
"""

from __future__ import annotations

import itertools
import linecache
import logging
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from opencortex.skills.compile_cache import CompileCache, cache_enabled
from opencortex.skills.loader import (
    SKILL_MODULE_PREFIX, HelperFinder, SkillError, forget_helpers, load_module, skills_in)
from opencortex.skills.skill import Skill, SkillContext
from opencortex.skills.skillmd import SkillDocs, load_docs, skill_load_tool
from opencortex.tools import Tool, ToolRegistry
from opencortex.tools.define import tools_in

log = logging.getLogger(__name__)

SKILL_SUFFIXES = (".org", ".hy")
_generations = itertools.count(1)


def skill_files(directory: Path) -> list[Path]:
    """The skill files of DIRECTORY in load order (helpers left out)."""
    return sorted(
        (file for file in directory.iterdir()
         if file.suffix.lower() in SKILL_SUFFIXES and file.is_file()
         and not file.name.startswith(("_", "."))),
        key=lambda file: file.name)


def module_name(path: Path, generation: int) -> str:
    """A fresh module name for skill file PATH in load GENERATION."""
    stem = re.sub(r"\W", "_", path.stem, flags=re.ASCII)
    return f"{SKILL_MODULE_PREFIX}{stem}_{generation}"


@contextmanager
def helpers_importable(directories: Sequence[Path], cache: CompileCache | None = None):
    """Let skill code require/import helper files (through CACHE) while the block runs."""
    finder = HelperFinder(directories, cache)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)


class SkillRegistry:
    """Skills loaded from DIRECTORIES, highest priority first; the tools the same
    files define (`deftool`) become TOOLS' "skills" group on every (re)load.
    With CACHE_DIR, compiled files are kept there (unless OPENCORTEX_SKILL_CACHE=0)."""

    def __init__(self, directories: Sequence[Path], tools: ToolRegistry | None = None,
                 cache_dir: Path | None = None):
        self.directories = [Path(d).expanduser().absolute() for d in directories]
        self.cache = CompileCache(cache_dir) if cache_dir and cache_enabled() else None
        self.tool_registry = tools if tools is not None else ToolRegistry()
        self.errors: list[SkillError] = []
        self.docs = SkillDocs()
        self._skills: list[Skill] = []
        self._tools: list[Tool] = []
        self._modules: list[str] = []
        self.after_reload: list[Callable[[], None]] = []   # run after each `reload`

    @property
    def tools(self) -> list[Tool]:
        """The tools the skill files define, in load order."""
        return list(self._tools)

    @property
    def skills(self) -> list[Skill]:
        """Loaded skills, highest priority first; ties by name."""
        return list(self._skills)

    def load(self) -> list[SkillError]:
        """(Re)load every skill file from disk; return the errors (also in `errors`)."""
        self._forget()
        generation = next(_generations)
        skills: dict[str, Skill] = {}
        tools: list[Tool] = []
        errors: list[SkillError] = []
        with helpers_importable(self.directories, self.cache):
            for directory in self.directories:
                for path in self._files(directory, errors):
                    for skill in self._load_file(path, generation, errors, tools):
                        self._add(skill, skills, errors)
        self._skills = sorted(skills.values(), key=lambda s: (-s.priority, s.name))
        self.docs = load_docs(self.directories)
        errors += self.docs.errors
        self._register_docs(errors)
        self._tools = self._register(tools, errors)
        self.errors = errors
        log.info("loaded %d skills, %d errors", len(self._skills), len(errors))
        return list(errors)

    def reload(self) -> list[SkillError]:
        """Drop everything loaded and load again from disk; then run `after_reload`."""
        errors = self.load()
        for hook in self.after_reload:
            hook()
        return errors

    def matching(self, ctx: SkillContext) -> list[Skill]:
        """Skills whose trigger accepts CTX, in priority order.

        A trigger that raises counts as not matching; only the skill name
        and the exception type are logged.
        """
        chosen = []
        for skill in self._skills:
            try:
                if skill.trigger(ctx):
                    chosen.append(skill)
            except Exception as err:
                log.warning("trigger of skill %s raised %s; treated as not matching",
                            skill.name, type(err).__name__)
        return chosen

    def get(self, name: str) -> Skill | None:
        """The loaded skill called NAME, or None."""
        return next((s for s in self._skills if s.name == name), None)

    def _files(self, directory: Path, errors: list[SkillError]) -> list[Path]:
        """Skill files of DIRECTORY; a missing one is skipped, an unreadable one reported."""
        if not directory.exists():
            log.info("skill directory %s does not exist; skipped", directory)
            return []
        try:
            return skill_files(directory)
        except OSError as err:
            errors.append(SkillError(directory, None, f"cannot list skill directory: "
                                     f"{err.strerror}; check that it is a readable directory"))
            return []

    def _register(self, tools: list[Tool], errors: list[SkillError]) -> list[Tool]:
        """Make TOOLS the registry's "skills" group; report names taken twice."""
        kept: dict[str, Tool] = {}
        for tool in tools:
            first = kept.get(tool.name)
            if first is not None:
                errors.append(SkillError(tool.source or Path("<skills>"), tool.line, (
                    f"tool {tool.name!r} is already defined at {first.source}:{first.line}; "
                    "rename one of them")))
                continue
            kept[tool.name] = tool
        for tool in self.tool_registry.replace("skills", list(kept.values())):
            group = self.tool_registry.group_of(tool.name)
            errors.append(SkillError(tool.source or Path("<skills>"), tool.line, (
                f"tool {tool.name!r} is already defined by {group}; rename this one")))
        return [tool for tool in kept.values() if self.tool_registry.get(tool.name) is tool]

    def _register_docs(self, errors: list[SkillError]) -> None:
        """Make `skill-load` (when there are SKILL.md skills) the "skill-docs" group."""
        tools = [skill_load_tool(self.docs)] if len(self.docs) else []
        for tool in self.tool_registry.replace("skill-docs", tools):
            errors.append(SkillError(Path("<skill-docs>"), None, (
                f"tool {tool.name!r} is already defined by "
                f"{self.tool_registry.group_of(tool.name)}; SKILL.md skills cannot be loaded")))

    def _load_file(self, path: Path, generation: int, errors: list[SkillError],
                   tools: list[Tool]) -> list[Skill]:
        """Load PATH as a new module, adding its tools to TOOLS; report failure into ERRORS."""
        name = module_name(path, generation)
        linecache.checkcache(str(path))
        try:
            module = load_module(path, name, self.cache)
        except SkillError as err:
            log.warning("skill file %s failed to load (line %s)", path, err.line)
            errors.append(err)
            return []
        self._modules.append(name)
        tools.extend(t if t.source else replace(t, source=path) for t in tools_in(module))
        return [s if s.source else _with_source(s, path) for s in skills_in(module)]

    def _add(self, skill: Skill, skills: dict[str, Skill],
             errors: list[SkillError]) -> None:
        """Add SKILL unless its name is taken; report a duplicate."""
        first = skills.get(skill.name)
        if first is None:
            skills[skill.name] = skill
            return
        errors.append(SkillError(
            skill.source, skill.line,
            f"skill {skill.name!r} is already defined at {first.source}:{first.line}; "
            f"rename one of them"))

    def _forget(self) -> None:
        """Remove the previous generation's modules and helpers from sys.modules.  Its
        skills stay until the new ones replace them whole: a turn prepared meanwhile, on
        another thread, finds the old skills, never none."""
        for name in self._modules:
            sys.modules.pop(name, None)
        self._modules = []
        forget_helpers(self.directories)


def _with_source(skill: Skill, path: Path) -> Skill:
    """SKILL with its source file filled in."""
    return replace(skill, source=path)
