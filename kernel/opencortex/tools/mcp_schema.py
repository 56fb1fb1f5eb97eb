"""An MCP tool's JSON schema: the arguments of a call checked against it, and the
call form shown to the model.

A model writes `:args (:max-results 3 :query "x")`; the reader gives lower-case
keys.  `ArgumentChecker.check` maps each key to the schema's property name
(exact, then `-` as `_`, then ignoring case and separators when that names
exactly one property), converts plist values to JSON (keywords and symbols to
strings; nil to false, [] or {} where the schema wants a boolean, list or
object), then validates with jsonschema in the dialect the schema names
(Draft 2020-12 when it names none).  A key that names no property is refused
unless the schema allows additional properties explicitly.

The schema comes from the server and the arguments from the model, so both are
bounded: schemas over MAX_SCHEMA_CHARS are refused, arguments over
MAX_ARGUMENT_CHARS too; `$ref`s resolve only inside the schema (nothing is
fetched); validation stops after MAX_STEPS keyword checks or MAX_ERROR_CHARS
of error text.  Keywords that could cost unbounded time are left to the
server, which checks its own arguments anyway: `pattern`,
`patternProperties`, `unevaluatedProperties`, `unevaluatedItems`, `format`,
and `uniqueItems` on lists longer than UNIQUE_LIMIT.
"""

from __future__ import annotations

import json
import math
import re
from itertools import islice
from typing import Any, Iterator, Mapping

import referencing
from jsonschema import Draft202012Validator, SchemaError, ValidationError, validators

from opencortex.excerpt import clip, excerpt
from opencortex.plist_syntax import Keyword, Symbol
from opencortex.untrusted import visible

MAX_SCHEMA_CHARS = 64_000
MAX_ARGUMENT_CHARS = 512_000
MAX_STEPS = 25_000
MAX_ERROR_CHARS = 2_000_000
UNIQUE_LIMIT = 2_000
MAX_SHOWN_PROBLEMS = 4
MAX_CALL_FORM = 600
MAX_DEPTH = 64
PROPERTY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_PLACEHOLDERS = {"string": "string", "integer": "integer", "number": "number",
                 "boolean": "t-or-nil", "array": "list", "object": "plist", "null": "nil"}
_KINDS = {"string": "a string", "integer": "an integer", "number": "a number",
          "boolean": "t or nil", "array": "a list", "object": "a plist", "null": "nil"}


class SchemaRefused(ValueError):
    """A tool's input schema cannot be used; the tool is not offered."""


class _OverBudget(Exception):
    """Checking the arguments took more than its bounded share of work."""


class _Budget:
    """Keyword checks and error text left for one `check`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps, self.chars = MAX_STEPS, MAX_ERROR_CHARS

    def spend(self, steps: int = 0, chars: int = 0) -> None:
        self.steps -= steps
        self.chars -= chars
        if self.steps < 0 or self.chars < 0:
            raise _OverBudget()


def _counted(function: Any, budget: _Budget) -> Any:
    """A jsonschema keyword function that spends BUDGET per use and per error."""
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        budget.spend(steps=1)
        for error in function(validator, value, instance, schema) or ():
            budget.spend(chars=len(error.message))
            yield error
    return keyword


def _skip(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """A keyword left to the server."""
    return iter(())


def _validator_class(schema: Mapping[str, Any], budget: _Budget) -> Any:
    """The dialect's validator class with every keyword counted and the costly ones skipped."""
    base = validators.validator_for(schema, default=Draft202012Validator)
    keywords = {name: _counted(function, budget) for name, function in base.VALIDATORS.items()}
    original_additional = base.VALIDATORS.get("additionalProperties")
    original_unique = base.VALIDATORS.get("uniqueItems")

    def additional(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if "patternProperties" in schema or original_additional is None:
            return ()
        return original_additional(validator, value, instance, schema)

    def unique(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if original_unique is None or (isinstance(instance, list)
                                       and len(instance) > UNIQUE_LIMIT):
            return ()
        return original_unique(validator, value, instance, schema)

    keywords.update({name: _skip for name in ("pattern", "patternProperties", "format",
                                              "unevaluatedProperties", "unevaluatedItems")})
    keywords["additionalProperties"] = _counted(additional, budget)
    keywords["uniqueItems"] = _counted(unique, budget)
    return validators.extend(base, keywords)


def plist_key(name: str) -> str:
    """A property name as the model writes it: `max_results` → `:max-results`."""
    return ":" + name.replace("_", "-")


class ArgumentChecker:
    """Checks and converts one tool's arguments against its input schema."""

    def __init__(self, schema: Any):
        self.schema = self._usable(schema)
        properties = self.schema.get("properties")
        self.properties: dict[str, Any] = properties if isinstance(properties, dict) else {}
        bad = [name for name in self.properties if not PROPERTY_NAME.fullmatch(name)]
        if bad:
            raise SchemaRefused(f"argument name {excerpt(bad[0], 40)} cannot be written "
                                "as a plist key")
        additional = self.schema.get("additionalProperties")
        self.open = additional is True or isinstance(additional, dict) \
            or "patternProperties" in self.schema or "properties" not in self.schema
        self._names = self._name_index()
        self._budget = _Budget()
        cls = _validator_class(self.schema, self._budget)
        try:
            cls.check_schema(self.schema)
        except SchemaError as error:
            raise SchemaRefused(f"invalid input schema: {clip(error.message, 120)}") from None
        self._validator = cls(self.schema, registry=referencing.Registry())

    @staticmethod
    def _usable(schema: Any) -> dict[str, Any]:
        """SCHEMA when it is an object schema of bounded size."""
        if not isinstance(schema, dict):
            raise SchemaRefused("the input schema is not a JSON object")
        try:
            size = len(json.dumps(schema))
        except (TypeError, ValueError, RecursionError):
            raise SchemaRefused("the input schema is not plain JSON") from None
        if size > MAX_SCHEMA_CHARS:
            raise SchemaRefused(f"the input schema is {size} characters "
                                f"(at most {MAX_SCHEMA_CHARS})")
        if schema.get("type", "object") != "object":
            raise SchemaRefused("the input schema does not describe an object")
        return schema

    def _name_index(self) -> dict[str, str]:
        """Folded name (lower case, no - or _) → property, for names that fold uniquely."""
        folded: dict[str, list[str]] = {}
        for name in self.properties:
            folded.setdefault(_fold(name), []).append(name)
        return {key: names[0] for key, names in folded.items() if len(names) == 1}

    def property_for(self, key: str) -> str | None:
        """The property KEY names, or None."""
        for name in (key, key.replace("-", "_")):
            if name in self.properties:
                return name
        return self._names.get(_fold(key))

    def check(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ARGS as the JSON object to send, or ValueError with short reasons."""
        problems: list[str] = []
        converted: dict[str, Any] = {}
        for key, value in dict(args).items():
            key = str(key)
            name = self.property_for(key)
            if name is None and not self.open:
                problems.append(self._unknown(key))
                continue
            name = name or key
            if name in converted:
                problems.append(f":{clip(key, 40)} repeats the argument {plist_key(name)}")
                continue
            converted[name] = _json_value(value, self.properties.get(name), 0)
        if problems:
            raise ValueError("; ".join(problems[:MAX_SHOWN_PROBLEMS]))
        self._bound(converted)
        problems = self._validate(converted)
        if problems:
            raise ValueError("; ".join(dict.fromkeys(problems)))
        return converted

    def _unknown(self, key: str) -> str:
        known = " ".join(plist_key(name) for name in list(self.properties)[:12]) or "none"
        return f":{clip(visible(key), 40)} is not an argument of this tool (its arguments: {known})"

    @staticmethod
    def _bound(converted: dict[str, Any]) -> None:
        try:
            size = len(json.dumps(converted, ensure_ascii=False, allow_nan=False))
        except ValueError:
            raise ValueError("numbers must be finite (no inf or nan)") from None
        except (TypeError, RecursionError):
            raise ValueError("the arguments cannot be sent as JSON") from None
        if size > MAX_ARGUMENT_CHARS:
            raise ValueError(f"the arguments are {size} characters as JSON "
                             f"(at most {MAX_ARGUMENT_CHARS})")

    def _validate(self, instance: dict[str, Any]) -> list[str]:
        self._budget.reset()
        try:
            errors = list(islice(self._validator.iter_errors(instance), MAX_SHOWN_PROBLEMS))
        except _OverBudget:
            return ["the arguments are too complex to check against the tool's schema"]
        except RecursionError:
            return ["the tool's schema nests too deeply to check"]
        except Exception as error:   # an unresolvable $ref, a number too large, ...
            return [f"the arguments cannot be checked against the tool's schema "
                    f"({type(error).__name__})"]
        return [_say(error, instance) for error in errors]

    def call_form(self) -> str:
        """The :args part of the call form: required arguments first, <type> placeholders."""
        required = self.schema.get("required")
        required = set(required) if isinstance(required, list) else set()
        names = sorted(self.properties, key=lambda name: name not in required)
        shown = " ".join(f"{plist_key(name)} <{_placeholder(self.properties[name])}"
                         f"{'' if name in required else ', optional'}>" for name in names)
        return clip(visible(shown), MAX_CALL_FORM)


def _fold(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _types(schema: Any) -> set[str]:
    """The JSON types SCHEMA names (empty when it names none)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _json_value(value: Any, schema: Any, depth: int) -> Any:
    """A plist value as JSON, shaped by SCHEMA where the plist is ambiguous."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the arguments nest deeper than {MAX_DEPTH} levels")
    if isinstance(value, (Keyword, Symbol)):
        return str(value)
    if value is None or value == []:
        kinds = _types(schema)
        if "null" not in kinds and value is None:
            if "boolean" in kinds:
                return False
            if "array" in kinds:
                return []
        if "object" in kinds and "array" not in kinds:
            return {}
        return value
    if isinstance(value, (list, tuple)):
        items = schema.get("items") if isinstance(schema, dict) else None
        return [_json_value(item, items, depth + 1) for item in value]
    if isinstance(value, Mapping):
        properties = schema.get("properties") if isinstance(schema, dict) else None
        properties = properties if isinstance(properties, dict) else {}
        result = {}
        for key, item in value.items():
            key = str(key)
            name = next((n for n in (key, key.replace("-", "_")) if n in properties), key)
            result[name] = _json_value(item, properties.get(name), depth + 1)
        return result
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite (no inf or nan)")
    return value


def _where(error: ValidationError) -> str:
    """Where in the arguments ERROR is: `:count`, `:tags item 2`."""
    parts = list(error.absolute_path)[:6]
    if not parts:
        return "the arguments"
    where = plist_key(str(parts[0])) if isinstance(parts[0], str) else f"item {parts[0]}"
    for part in parts[1:]:
        where += f" item {part}" if isinstance(part, int) else f" {plist_key(str(part))}"
    return clip(visible(where), 80)


def _say(error: ValidationError, instance: dict[str, Any]) -> str:
    """ERROR in a short sentence."""
    where = _where(error)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        names = " ".join(plist_key(str(name)) for name in missing[:6])
        prefix = "" if error.instance is instance else f"{where}: "
        return clip(visible(f"{prefix}missing {names}"), 160)
    if error.validator == "type":
        wanted = [error.validator_value] if isinstance(error.validator_value, str) \
            else list(error.validator_value)
        kinds = " or ".join(_KINDS.get(str(kind), str(kind)) for kind in wanted[:4])
        return f"{where} must be {kinds}, not {excerpt(error.instance, 40)}"
    if error.validator == "enum" and isinstance(error.validator_value, list):
        choices = ", ".join(excerpt(choice, 30) for choice in error.validator_value[:10])
        return f"{where} must be one of {choices}, not {excerpt(error.instance, 40)}"
    return f"{where}: {clip(visible(error.message), 160)}"


def _placeholder(schema: Any) -> str:
    """A short name for what a property takes: string, integer, "fast"|"slow", ..."""
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list):
        choices = "|".join(excerpt(choice, 20) for choice in schema["enum"][:8])
        return choices if len(choices) <= 60 else "choice"
    kinds = sorted(_types(schema) - {"null"})
    return _PLACEHOLDERS.get(kinds[0], "value") if len(kinds) == 1 else "value"
