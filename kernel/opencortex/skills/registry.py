"""The set of loaded skills: load directories, order by priority, reload.

Each load is a new generation: every skill file becomes a fresh module
named `opencortex_skill_<stem>_<n>` (n unique per process), the previous
generation's modules and helper modules leave `sys.modules`, and files
are compiled from source again.  Within a directory, files load in sorted
file-name order; directories load in the order given.  `.org` and `.hy`
files are skills; names starting with `_` or `.` are not (a `_name.hy`
helper loads only when a skill requires or imports it, fresh each
generation).  A missing directory is skipped (nothing to load); a broken
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
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from opencortex.skills.loader import (
    SKILL_MODULE_PREFIX, HelperFinder, SkillError, forget_helpers, load_module, skills_in)
from opencortex.skills.skill import Skill, SkillContext

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
def helpers_importable(directories: Sequence[Path]):
    """Let skill code require/import helper files while the block runs."""
    finder = HelperFinder(directories)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)


class SkillRegistry:
    """Skills loaded from DIRECTORIES, highest priority first."""

    def __init__(self, directories: Sequence[Path]):
        self.directories = [Path(d).expanduser().absolute() for d in directories]
        self.errors: list[SkillError] = []
        self._skills: list[Skill] = []
        self._modules: list[str] = []

    @property
    def skills(self) -> list[Skill]:
        """Loaded skills, highest priority first; ties by name."""
        return list(self._skills)

    def load(self) -> list[SkillError]:
        """(Re)load every skill file from disk; return the errors (also in `errors`)."""
        self._forget()
        generation = next(_generations)
        skills: dict[str, Skill] = {}
        errors: list[SkillError] = []
        with helpers_importable(self.directories):
            for directory in self.directories:
                for path in self._files(directory, errors):
                    for skill in self._load_file(path, generation, errors):
                        self._add(skill, skills, errors)
        self._skills = sorted(skills.values(), key=lambda s: (-s.priority, s.name))
        self.errors = errors
        log.info("loaded %d skills, %d errors", len(self._skills), len(errors))
        return list(errors)

    def reload(self) -> list[SkillError]:
        """Drop everything loaded and load again from disk."""
        return self.load()

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

    def _load_file(self, path: Path, generation: int,
                   errors: list[SkillError]) -> list[Skill]:
        """Load PATH as a new module; report failure into ERRORS."""
        name = module_name(path, generation)
        linecache.checkcache(str(path))
        try:
            module = load_module(path, name)
        except SkillError as err:
            log.warning("skill file %s failed to load (line %s)", path, err.line)
            errors.append(err)
            return []
        self._modules.append(name)
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
        """Remove the previous generation's modules and helpers from sys.modules."""
        for name in self._modules:
            sys.modules.pop(name, None)
        self._modules = []
        forget_helpers(self.directories)
        self._skills = []


def _with_source(skill: Skill, path: Path) -> Skill:
    """SKILL with its source file filled in."""
    return replace(skill, source=path)
