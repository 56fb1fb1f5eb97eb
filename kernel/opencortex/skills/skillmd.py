"""SKILL.md skills (the agentskills.io format): found, parsed, checked, disclosed.

A folder NAME/ of a skill directory holding `SKILL.md` is a SKILL.md skill.
The file starts with YAML front matter between `---` lines: `name` (1-64
lowercase ASCII letters, digits and single hyphens; equal to the folder
name), `description` (1-1024 characters), optional `license`,
`compatibility` (<= 500 characters), `allowed-tools` (tool names separated
by spaces, or a YAML list; see `narrowed`) and `metadata` (a string map;
numbers and booleans are read as their text).  Other keys are ignored
(clients add their own).  The markdown body follows; the folder may hold
scripts/, references/, assets/.

Progressive disclosure: only `catalogue()` (name and one-line description)
enters every prompt; the `skill-load` tool gives the model the body, the
absolute folder path and the file list.  Scripts have no executor of their
own: the model names them in a shell request, which always asks the person.

Hostile files cost bounded time and memory (size caps below; the front
matter is read as `frontmatter` says).  Every problem is a SkillError naming
SKILL.md and the line of the offending key (line 1 when the front matter is
missing).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from opencortex.excerpt import clip
from opencortex.printer import print_string
from opencortex.skills.frontmatter import (FrontMatterProblem, checked, read_front_matter,
                                           split_front_matter)
from opencortex.skills.loader import SkillError
from opencortex.tools.registry import Tool

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
MAX_FILE_BYTES = 256 * 1024
MAX_SKILLS = 200        # SKILL.md skills loaded in all; the rest are reported
MAX_LISTED = 50         # files named by body()
MAX_VISITED = 2000      # directory entries looked at while listing a folder
SKILL_LOAD = "skill-load"
TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")
INTERPRETERS = {".sh": "bash", ".bash": "bash", ".py": "python3"}


class SkillWarning(SkillError):
    """A SKILL.md skill loaded, but part of it was ignored (e.g. allowed-tools syntax)."""

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: warning: {self.message}"


@dataclass(frozen=True)
class SkillDoc:
    """One loaded SKILL.md skill; `folder` is absolute, `files` relative to it."""

    name: str
    description: str
    body: str
    folder: Path
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: frozenset[str] | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    more_files: bool = False

    @property
    def path(self) -> Path:
        return self.folder / SKILL_FILE


def allowed_entries(value: str | list[str] | None) -> tuple[frozenset[str] | None, list[str]]:
    """The allowed-tools entries kept (exact names, `prefix/*`) and those ignored."""
    if value is None:
        return None, []
    entries = value.split() if isinstance(value, str) else list(value)
    kept = [e for e in entries if TOOL_NAME.fullmatch(e.removesuffix("/*"))
            and "*" not in e.removesuffix("/*")]
    return frozenset(kept), [e for e in entries if e not in kept]


def narrowed(tool_name: str, allowed: frozenset[str] | None) -> bool:
    """Whether a call of TOOL_NAME is permitted by a skill's allowed-tools ALLOWED.

    None (no allowed-tools) narrows nothing.  An entry is an exact tool name or
    `prefix/*` (every tool named `prefix/...`).  `skill-load` is always
    permitted: reading instructions does nothing.  This only ever takes calls
    away; the approval policy still decides every call it leaves.
    """
    if allowed is None or tool_name == SKILL_LOAD or tool_name in allowed:
        return True
    return any(entry.endswith("/*") and tool_name.startswith(entry[:-1])
               for entry in allowed)


def folder_files(folder: Path) -> tuple[tuple[str, ...], bool]:
    """Up to MAX_LISTED files under FOLDER, relative and sorted (SKILL.md and hidden
    ones left out, links not followed), and whether there are more."""
    found: list[str] = []
    visited = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        visited += len(dirs) + len(files)
        base = Path(root).relative_to(folder)
        found += [(base / f).as_posix() for f in sorted(files)
                  if not f.startswith(".") and (root, f) != (str(folder), SKILL_FILE)]
        if len(found) > MAX_LISTED or visited > MAX_VISITED:
            return tuple(found[:MAX_LISTED]), True
    return tuple(found), False


def read_skill(folder: Path) -> tuple[SkillDoc | None, list[SkillError]]:
    """The SKILL.md skill in FOLDER (None if invalid), and its errors and warnings."""
    path = folder / SKILL_FILE
    try:
        source, body = split_front_matter(_read(path).removeprefix("\ufeff"))
        data, lines = read_front_matter(source)
    except FrontMatterProblem as err:
        return None, [SkillError(path, err.line, str(err))]
    except SkillError as err:
        return None, [err]
    front, problems = checked(data, lines, folder)
    if front is None:
        return None, [SkillError(path, p.line, str(p)) for p in problems]
    allowed, ignored = allowed_entries(front.allowed_tools)
    warnings: list[SkillError] = []
    if ignored:
        shown = " ".join(clip(e, 40) for e in ignored[:10])
        warnings.append(SkillWarning(path, lines.get("allowed-tools"), (
            f"allowed-tools: ignored {shown} (only exact tool names and prefix/* are "
            f"understood); once loaded the skill may use only: "
            f"{' '.join(sorted(allowed or ())) or 'no tools'}")))
    files, more = folder_files(folder)
    return SkillDoc(name=front.name, description=" ".join(front.description.split()),
                    body=body, folder=folder, license=front.license,
                    compatibility=front.compatibility, allowed_tools=allowed,
                    metadata=front.metadata, files=files, more_files=more), warnings


def _read(path: Path) -> str:
    """PATH as text, refused past MAX_FILE_BYTES or when not UTF-8."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SkillError(path, None, f"cannot read the file: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SkillError(path, 1, f"SKILL.md is larger than {MAX_FILE_BYTES // 1024} KB; "
                         "keep it short and move detail into references/ files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SkillError(path, None, f"not valid UTF-8 ({err.reason} at byte {err.start}); "
                         "save the file as UTF-8") from None


def skill_folders(directory: Path) -> list[Path]:
    """Folders of DIRECTORY holding SKILL.md, by name (names starting `_`/`.` left out).
    A missing or unreadable directory gives none (the registry reports it)."""
    try:
        return sorted((d for d in directory.iterdir()
                       if not d.name.startswith(("_", ".")) and (d / SKILL_FILE).is_file()),
                      key=lambda d: d.name)
    except OSError:
        return []


class SkillDocs:
    """The SKILL.md skills of some directories, by name; `errors` says what failed."""

    def __init__(self, docs: Iterable[SkillDoc] = (), errors: Sequence[SkillError] = ()):
        self._docs = {doc.name: doc for doc in docs}
        self.errors: list[SkillError] = list(errors)

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, name: str) -> SkillDoc | None:
        """The skill NAME, or None."""
        return self._docs.get(name)

    def catalogue(self) -> dict[str, str]:
        """Name → one-line description of every skill, by name: all a prompt shows."""
        return {name: self._docs[name].description for name in sorted(self._docs)}

    def allowed_tools(self, name: str) -> frozenset[str] | None:
        """The allowed-tools of skill NAME (None when it gives none)."""
        return self._known(name).allowed_tools

    def body(self, name: str) -> str:
        """What `skill-load` answers: folder, how to run scripts, files, instructions."""
        doc = self._known(name)
        parts = [f"Skill {doc.name}. Its folder: {doc.folder}", *_script_hint(doc)]
        if doc.files:
            listed = [f"- {file}" for file in doc.files]
            more = ["- (more files, not listed)"] if doc.more_files else []
            parts += ["Files in the folder (relative paths):", *listed, *more]
        return "\n".join(parts) + "\n\n" + doc.body

    def _known(self, name: str) -> SkillDoc:
        """The skill NAME; ValueError listing the known names otherwise."""
        doc = self._docs.get(name)
        if doc is None:
            names = ", ".join(sorted(self._docs)) or "none"
            raise ValueError(f"no skill named {clip(str(name), 64)!r}; known skills: "
                             f"{clip(names, 2000)}")
        return doc


def _script_hint(doc: SkillDoc) -> list[str]:
    """How to run the skill's first script: an approved shell request, as an example."""
    script = next((f for f in doc.files if f.startswith("scripts/")), None)
    if script is None:
        return []
    path = str(doc.folder / script)
    interpreter = INTERPRETERS.get(Path(script).suffix)
    argv = " ".join(print_string(a) for a in ([interpreter] if interpreter else []) + [path])
    return ["Run its scripts by absolute path with a shell request (the person approves "
            f"it), e.g. (:type :REQUEST :target :shell :cmd ({argv}))"]


def load_docs(directories: Sequence[Path]) -> SkillDocs:
    """The SKILL.md skills of DIRECTORIES (first one of a name wins), with errors."""
    docs: dict[str, SkillDoc] = {}
    errors: list[SkillError] = []
    for folder in (f for d in directories for f in skill_folders(Path(d))):
        if len(docs) >= MAX_SKILLS:
            errors.append(SkillError(folder / SKILL_FILE, None, f"more than {MAX_SKILLS} "
                                     "SKILL.md skills; this one and later ones are skipped"))
            break
        doc, problems = read_skill(folder.absolute())
        errors += problems
        if doc is None:
            continue
        first = docs.get(doc.name)
        if first is not None:
            errors.append(SkillError(doc.path, None, f"skill {doc.name!r} is already defined "
                                     f"at {first.path}; rename one of them"))
            continue
        docs[doc.name] = doc
    log.info("loaded %d SKILL.md skills, %d errors", len(docs), len(errors))
    return SkillDocs(docs.values(), errors)


class SkillLoadArguments(BaseModel):
    """The arguments of `skill-load`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=200)


def skill_load_tool(docs: SkillDocs) -> Tool:
    """The read-only `skill-load` tool answering from DOCS."""
    def run(args: SkillLoadArguments, ctx: Any = None) -> str:
        return docs.body(args.name)
    return Tool(SKILL_LOAD, "Load a skill from the skills catalogue by name: its "
                "instructions, folder and files. Load one before doing what it covers.",
                SkillLoadArguments, run, risk="read-only", trust="kernel")
