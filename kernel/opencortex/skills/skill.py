"""What a skill is, what it sees, and what it may answer.

A skill is a named pair of phases chosen by a trigger:

- `trigger(ctx) -> bool` says whether the skill applies to this turn;
- `probabilistic(ctx)` returns a prompt request for the model (a dict or a
  PromptRequest; the kernel validates it);
- `deterministic(action, ctx)` checks the action the model asked for and
  returns a verdict: None (pass it unchanged), a dict (the rewritten action),
  a `Rejection` (ask the model again, telling it why) or a `NeedsApproval`
  (ask the person first).

Skills are written in Hy with `defskill` (see `dsl.hy`), which calls
`define_skill` below.  Skills only read the `SkillContext` they are given;
they never reach into the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencortex.events import ChatMessage, Thread

OPTIONS = ("trigger", "probabilistic", "deterministic", "priority", "description", "pins_turn")
"""The keyword options `defskill` accepts (Python spelling)."""


@dataclass(frozen=True)
class SkillContext:
    """Everything a skill may look at during one turn.

    `history` holds what the model may see of the thread (its working context:
    entries with `role`, `text`, `kind`, `turn`), oldest first; `recalled` holds
    earlier messages of the same owner brought in for this turn;
    `attempt` counts earlier replies asked for in this turn (0 for the first);
    `rejections` holds the reasons earlier replies of this turn were rejected.
    `thread` defaults to the event's thread.  `skills_catalogue` maps each
    SKILL.md skill's name to its one-line description (what the prompt lists;
    the model loads a body with the `skill-load` tool).
    """

    event: ChatMessage
    thread: Thread | None = None
    history: Sequence[Any] = ()
    recalled: Sequence[Any] = ()
    persona: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)
    tools: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 0
    rejections: Sequence[str] = ()
    skills_catalogue: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.thread is None:
            object.__setattr__(self, "thread", self.event.thread)


@dataclass(frozen=True)
class Skill:
    """A loaded skill.  `source` and `line` say where its `defskill` stood;
    `pins_turn`: the turns this skill handles are pinned (PRESERVED) once archived."""

    name: str
    trigger: Callable[[SkillContext], bool]
    probabilistic: Callable[[SkillContext], Any] | None = None
    deterministic: Callable[[dict, SkillContext], Any] | None = None
    priority: int = 10
    description: str = ""
    pins_turn: bool = False
    source: Path | None = None
    line: int | None = None
    module: str = ""

    def __post_init__(self) -> None:
        where = f"skill {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a skill needs a non-empty name")
        if not callable(self.trigger):
            raise TypeError(
                f"{where}: :trigger must be a function of the context, "
                f"got {type(self.trigger).__name__}")
        for phase in ("probabilistic", "deterministic"):
            value = getattr(self, phase)
            if value is not None and not callable(value):
                raise TypeError(
                    f"{where}: :{phase} must be a function or None, "
                    f"got {type(value).__name__}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise TypeError(
                f"{where}: :priority must be an integer, "
                f"got {type(self.priority).__name__}")
        if not isinstance(self.description, str):
            raise TypeError(f"{where}: :description must be a string")
        if not isinstance(self.pins_turn, bool):
            raise TypeError(f"{where}: :pins-turn must be True or False")


class DefskillError(TypeError):
    """A `defskill` form is wrong; `line` is where the form starts."""

    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.line = line


def define_skill(name: str, module: str, source: str | None, line: int | None,
                 /, *stray: Any, **options: Any) -> Skill:
    """Build the Skill a `defskill` form describes; explain any mistake.

    NAME, MODULE, SOURCE and LINE come from the macro; OPTIONS are the
    keyword options written in the form.  SOURCE names like "<string>"
    (code without a file) are recorded as None.
    """
    where = f"defskill {name}"
    if stray:
        raise DefskillError(
            f"{where}: options come as :keyword value pairs "
            f"(e.g. :trigger greeting?); found a value without a keyword", line)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise DefskillError(
            f"{where}: unknown option {', '.join(_keyword(k) for k in unknown)}; "
            f"known options are {', '.join(_keyword(k) for k in OPTIONS)}", line)
    if options.get("trigger") is None:
        raise DefskillError(
            f"{where}: missing :trigger; add `:trigger some-predicate`, "
            f"a function of the context that returns true when the skill applies", line)
    path = Path(source) if source and not source.startswith("<") else None
    try:
        return Skill(name=name, module=module, source=path, line=line, **options)
    except (TypeError, ValueError) as err:
        raise DefskillError(str(err), line) from None


def _keyword(python_name: str) -> str:
    """Spell an option as Hy code writes it: priority -> :priority."""
    return ":" + python_name.replace("_", "-")


@dataclass(frozen=True)
class Rejection:
    """Verdict: refuse the action; REASON goes back to the model."""

    reason: str


@dataclass(frozen=True)
class NeedsApproval:
    """Verdict: ask the person before acting; REASON is shown to them."""

    reason: str


def _reason(reason: Any, verdict: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"{verdict} needs a non-empty reason string "
                         f"that says what is wrong")
    return reason


def reject(reason: str) -> Rejection:
    """Refuse the model's action, telling it REASON so it can try again."""
    return Rejection(_reason(reason, "reject"))


def needs_approval(reason: str) -> NeedsApproval:
    """Hold the model's action until the person approves; REASON says why."""
    return NeedsApproval(_reason(reason, "needs-approval"))
