"""The YAML front matter of a SKILL.md file: split off, read safely, checked.

The front matter sits between `---` lines at the top of the file (see
`skillmd` for its keys).  It is read with PyYAML's safe loader, refusing
aliases and deep nesting, and within MAX_FRONT_MATTER_CHARS, so a hostile
file costs bounded time and memory.  Every problem is a FrontMatterProblem
carrying the SKILL.md line of the offending key (1 when the front matter is
missing).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from opencortex.excerpt import clip

MAX_FRONT_MATTER_CHARS = 16 * 1024
MAX_YAML_DEPTH = 16
MAX_PROBLEMS = 5        # front-matter problems reported per file
NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def _text_map(value: Any) -> Any:
    """METADATA with scalar keys and values as text (YAML reads `1.0` as a float)."""
    def text(item: Any) -> Any:
        if isinstance(item, bool):
            return "true" if item else "false"
        return str(item) if isinstance(item, (int, float)) else item
    return {text(k): text(v) for k, v in value.items()} if isinstance(value, dict) else value


def _name(value: Any) -> Any:
    """VALUE if it is a valid skill name; ValueError saying the rule otherwise."""
    if isinstance(value, str) and (len(value) > 64 or not NAME.fullmatch(value)):
        raise ValueError("must be 1-64 lowercase letters, digits and single hyphens, "
                         "not starting or ending with a hyphen (e.g. release-notes)")
    return value


def _filled(value: Any) -> Any:
    """VALUE unless it is a blank string."""
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    return value


class FrontMatter(BaseModel):
    """The front matter keys this kernel reads; other keys are ignored."""

    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, BeforeValidator(_name)]
    description: Annotated[str, BeforeValidator(_filled), Field(max_length=1024)]
    license: str | None = None
    compatibility: Annotated[str, BeforeValidator(_filled), Field(max_length=500)] | None = None
    allowed_tools: str | list[str] | None = Field(None, alias="allowed-tools")
    metadata: Annotated[dict[str, str], BeforeValidator(_text_map)] = {}


class FrontMatterProblem(Exception):
    """A front-matter problem at LINE of SKILL.md."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (`*name`) and deep nesting."""

    depth = 0

    def compose_node(self, parent, index):
        """Compose as SafeLoader does, within the bounds above."""
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise FrontMatterProblem(event.start_mark.line, "YAML aliases (*name) are not allowed "
                           "in SKILL.md front matter; write the value out")
        if self.depth >= MAX_YAML_DEPTH:
            raise FrontMatterProblem(event.start_mark.line, f"the front matter nests deeper than "
                           f"{MAX_YAML_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def split_front_matter(text: str) -> tuple[str, str]:
    """TEXT's YAML front matter and its markdown body."""
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        raise FrontMatterProblem(1, "SKILL.md must start with a `---` line, then YAML front matter "
                       "(name: ..., description: ...), then a closing `---` line")
    size = 0
    for number in range(1, len(lines)):
        if lines[number].rstrip() == "---":
            return "\n".join(lines[1:number]), "\n".join(lines[number + 1:]).strip("\r\n")
        size += len(lines[number]) + 1
        if size > MAX_FRONT_MATTER_CHARS:
            raise FrontMatterProblem(1, f"the front matter runs past {MAX_FRONT_MATTER_CHARS} "
                           "characters; close it with a `---` line and keep it short")
    raise FrontMatterProblem(1, "the front matter is not closed; add a `---` line after it")


def read_front_matter(source: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The YAML mapping SOURCE holds and the SKILL.md line of each top-level key."""
    loader = _BoundedLoader(source)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as err:
        raise FrontMatterProblem(*_yaml_problem(err)) from None
    except FrontMatterProblem as err:
        raise FrontMatterProblem(err.line + 2, str(err)) from None
    except (yaml.YAMLError, RecursionError) as err:
        raise FrontMatterProblem(1, f"bad YAML: {type(err).__name__}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise FrontMatterProblem(2, "the front matter must be a YAML mapping (name: ..., "
                       "description: ...)")
    lines: dict[str, int] = {}
    for key in (key for key, _ in node.value if isinstance(key, yaml.ScalarNode)):
        if key.value in lines:
            raise FrontMatterProblem(key.start_mark.line + 2, f"key {clip(key.value, 40)!r} "
                           f"is given twice (first at line {lines[key.value]})")
        lines[key.value] = key.start_mark.line + 2
    return data, lines


def _yaml_problem(err: yaml.MarkedYAMLError) -> tuple[int, str]:
    """The SKILL.md line where the construct ERR is about starts, and a message."""
    start, found = err.context_mark or err.problem_mark, err.problem_mark
    where = f" (line {found.line + 2})" if found and start is not found else ""
    problem = ": ".join(filter(None, [err.context, err.problem]))
    return (start.line + 2 if start else 1), f"bad YAML: {problem}{where}"


def checked(data: dict[str, Any], lines: dict[str, int],
            folder: Path) -> tuple[FrontMatter | None, list[FrontMatterProblem]]:
    """DATA validated as the front matter of FOLDER's skill, or the problems found."""
    try:
        front = FrontMatter.model_validate(data)
    except ValidationError as err:
        return None, [FrontMatterProblem(lines.get(str(problem["loc"][0]), 1), _problem(problem))
                      for problem in err.errors(include_url=False)[:MAX_PROBLEMS]]
    if front.name != folder.name:
        return None, [FrontMatterProblem(lines.get("name", 1), (
            f"name {front.name!r} must equal the folder name {clip(folder.name, 64)!r}; "
            "rename one of them"))]
    return front, []


def _problem(problem: dict[str, Any]) -> str:
    """One pydantic problem as a sentence naming the front-matter key."""
    key = ".".join(str(part) for part in problem["loc"][:2])
    if problem["type"] == "missing":
        return f"missing required key `{key}`; add `{key}: ...` to the front matter"
    return f"{clip(key, 60)}: {problem['msg'].removeprefix('Value error, ')}"
