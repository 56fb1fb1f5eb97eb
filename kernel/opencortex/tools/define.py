"""`deftool`: a Tool from a Hy function, its arguments typed by its annotations.

`(deftool files-read [ctx #^ str path #^ int [max-chars 20000]] "Read a file." :risk :read-only ...)`
defines an async function and calls `define_tool` below, which derives the
argument model (pydantic, extra arguments forbidden) from the annotations of
every parameter after the first (the ToolContext).  Mistakes are reported
with the file and line of the `deftool` form.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, create_model

from opencortex.tools.registry import RISKS, Tool

OPTIONS = ("risk", "preview", "needs_approval")


class DeftoolError(TypeError):
    """A `deftool` form is wrong; `line` is where the form starts."""

    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.line = line


def _plain(value: Any) -> Any:
    """A Hy keyword (:read-only) as its name; anything else as it is."""
    return value.name if type(value).__name__ == "Keyword" and hasattr(value, "name") else value


def argument_model(name: str, function: Callable, line: int | None) -> type[BaseModel]:
    """The pydantic model of FUNCTION's parameters after the first, from annotations."""
    try:   # annotations may arrive as strings (postponed evaluation): resolve them
        parameters = list(inspect.signature(function, eval_str=True).parameters.values())
    except Exception as error:   # a name in an annotation is not defined
        raise DeftoolError(f"deftool {name}: an argument type cannot be used: "
                           f"{type(error).__name__}: {error}", line) from None
    if not parameters:
        raise DeftoolError(f"deftool {name}: the first parameter receives the tool context; "
                           f"write (deftool {name} [ctx ...] ...)", line)
    fields: dict[str, Any] = {}
    for parameter in parameters[1:]:
        shown = parameter.name.replace("_", "-")
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise DeftoolError(f"deftool {name}: argument {shown} must be a plain named "
                               "argument (no #* or #**)", line)
        if parameter.annotation is inspect.Parameter.empty:
            raise DeftoolError(f"deftool {name}: argument {shown} needs a type, e.g. "
                               f"#^ str {shown}", line)
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (parameter.annotation, default)
    try:
        return create_model(f"{name}-arguments", __config__=ConfigDict(extra="forbid"),
                            **fields)
    except Exception as error:   # pydantic cannot use an annotation
        raise DeftoolError(f"deftool {name}: {type(error).__name__}: {error}", line) from None


def define_tool(name: str, function: Callable, module: str, source: str | None,
                line: int | None, /, *stray: Any, **options: Any) -> Tool:
    """The Tool a `deftool` form describes (NAME, FUNCTION, MODULE, SOURCE and LINE
    come from the macro; OPTIONS are the form's keyword options)."""
    if stray:
        raise DeftoolError(f"deftool {name}: options come as :keyword value pairs "
                           "(e.g. :risk :writes) after the docstring", line)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise DeftoolError(f"deftool {name}: unknown option "
                           f"{', '.join(':' + k.replace('_', '-') for k in unknown)}; "
                           f"known options are {', '.join(':' + k for k in OPTIONS)}", line)
    description = inspect.getdoc(function) or ""
    if not description:
        raise DeftoolError(f"deftool {name}: write a docstring saying what the tool does; "
                           "the model reads it", line)
    risk = _plain(options.get("risk", "read-only"))
    if risk not in RISKS:
        raise DeftoolError(f"deftool {name}: :risk must be one of "
                           f"{', '.join(':' + r for r in RISKS)}, not {risk!r}", line)
    hooks = {}
    for option in ("preview", "needs_approval"):
        hook = options.get(option)
        if hook is not None and not callable(hook):
            raise DeftoolError(f"deftool {name}: :{option.replace('_', '-')} must be a "
                               "function of the context and the tool's arguments", line)
        hooks[option] = _with_arguments(hook) if hook is not None else None
    arguments = argument_model(name, function, line)
    path = Path(source) if source and not source.startswith("<") else None
    return Tool(name=name, description=" ".join(description.split()), arguments=arguments,
                run=_with_arguments(function), risk=risk, source=path, line=line, **hooks)


def _with_arguments(function: Callable) -> Callable[[BaseModel, Any], Any]:
    """FUNCTION (of ctx and keyword arguments) as a function of (arguments model, ctx)."""
    return lambda args, ctx: function(ctx, **args.model_dump())


def tools_in(module: Any) -> list[Tool]:
    """The tools a loaded skill module defines with `deftool`."""
    return [value for value in vars(module).values() if isinstance(value, Tool)]
