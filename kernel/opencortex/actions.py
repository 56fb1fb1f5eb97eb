"""Typed actions, one model per target and action, deny by default.

A model reply, once read as a plist (see `opencortex.reader`), becomes one of
the actions below or is rejected with the reasons.  Nothing that is not
described here can be accepted: an unknown type, target or action, a missing
or mistyped field, or any extra field is a rejection.  Keys that look like an
approval are rejected outright: only a person can approve an action.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from opencortex.tools import ToolRegistry
from opencortex.reader import Keyword, Symbol, print_plist, print_value

APPROVAL_KEYS = frozenset({
    "approved", "approve", "approval", "approved-by", "approved-p", "pre-approved",
    "auto-approve", "autoapprove", "confirmed", "confirm", "user-approved",
    "user-confirmed", "authorized", "authorised", "consent", "skip-approval",
    "no-approval", "bypass-approval", "sudo", "force",
})


class ActionRejected(ValueError):
    """A plist is not an acceptable action; `reasons` says why, one per problem."""

    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def _keyword(value: Any) -> Any:
    if not isinstance(value, Keyword):
        raise ValueError(f"must be a keyword such as :{value}, not a {type(value).__name__}")
    return value


def _plain_text(value: Any) -> Any:
    if isinstance(value, (Keyword, Symbol)):
        raise ValueError("must be a string in double quotes")
    return value


Text = Annotated[str, BeforeValidator(_plain_text)]
Name = Annotated[str, Field(min_length=1, max_length=512), BeforeValidator(_plain_text)]


def kw(*names: str) -> Any:
    """A field that must be one of NAMES, written as a keyword."""
    return Annotated[Literal[names], BeforeValidator(_keyword)]  # type: ignore[valid-type]


class Action(BaseModel):
    """Common base: extra fields forbidden, keys use the plist's hyphenated names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              alias_generator=lambda name: name.replace("_", "-"))

    @property
    def reply_text(self) -> str | None:
        """The words a person will read, when this action says something."""
        return getattr(self, "text", None)

    def to_plist(self) -> dict[str, Any]:
        """This action as reader-shaped data: keyword values become Keywords."""
        data = self.model_dump(by_alias=True, exclude_none=True)
        for key in ("type", "target", "action", "level"):
            if key in data:
                data[key] = Keyword(data[key])
        return data

    def printed(self) -> str:
        return print_plist(self.to_plist())


class EmacsInsert(Action):
    """Insert TEXT at the end of an Emacs buffer (the chat buffer unless configured)."""
    type: kw("request")
    target: kw("emacs")
    action: kw("insert-at-end")
    buffer: Name
    text: Text


class ChatIdMessage(Action):
    """Send TEXT to a Telegram or Signal chat."""
    type: kw("request")
    target: kw("telegram", "signal")
    chat_id: Name
    text: Text


class MatrixMessage(Action):
    """Send TEXT to a Matrix room."""
    type: kw("request")
    target: kw("matrix")
    room_id: Name
    text: Text


class CliPrint(Action):
    """Print TEXT in the terminal chat."""
    type: kw("request")
    target: kw("cli")
    text: Text


class ToolCall(Action):
    """Call a registered tool with typed arguments."""
    type: kw("request")
    target: kw("tool")
    action: kw("call")
    tool: Name
    args: dict[str, Any] = Field(default_factory=dict)

    @property
    def reply_text(self) -> None:
        return None


class ShellCommand(Action):
    """Run a command: never accepted outright, a person must approve it."""
    type: kw("request")
    target: kw("shell")
    cmd: Union[Text, list[Text]]
    reason: Text | None = None
    cwd: Text | None = None

    @property
    def reply_text(self) -> None:
        return None


class Response(Action):
    """A reply to whoever sent the message, on the channel it came from."""
    type: kw("response")
    text: Text


class Log(Action):
    """A note the model keeps for itself: archived as a thought, shown nowhere."""
    type: kw("log")
    text: Text
    level: kw("debug", "info", "warning", "error") | None = None

    @property
    def reply_text(self) -> None:
        return None


REQUEST_MODELS: dict[str, type[Action]] = {
    "emacs": EmacsInsert, "telegram": ChatIdMessage, "signal": ChatIdMessage,
    "matrix": MatrixMessage, "cli": CliPrint, "tool": ToolCall, "shell": ShellCommand,
}
TYPE_MODELS: dict[str, type[Action]] = {"response": Response, "log": Log}
TARGETS = tuple(REQUEST_MODELS)


def _approval_keys(form: Mapping[str, Any], path: str = "") -> list[str]:
    found = []
    for key, value in form.items():
        if str(key).lower() in APPROVAL_KEYS:
            found.append(f"{path}:{key}")
        if isinstance(value, Mapping):
            found.extend(_approval_keys(value, f"{path}:{key} "))
    return found


def _describe(error: ValidationError) -> list[str]:
    reasons = []
    for item in error.errors():
        where = " ".join(f":{p}" for p in item["loc"] if isinstance(p, str))
        if item["type"] == "extra_forbidden":
            reasons.append(f"{where} is not a field of this action")
        elif item["type"] == "missing":
            reasons.append(f"{where} is missing")
        else:
            reasons.append(f"{where} {item['msg'].removeprefix('Value error, ')}")
    return reasons


def _model_for(form: Mapping[str, Any]) -> type[Action]:
    kind = form.get("type")
    if kind is None:
        raise ActionRejected([":type is missing (expected :REQUEST, :RESPONSE or :LOG)"])
    if not isinstance(kind, Keyword):
        raise ActionRejected([f":type must be a keyword such as :REQUEST, not {kind!r}"])
    if kind in TYPE_MODELS:
        return TYPE_MODELS[kind]
    if kind != "request":
        raise ActionRejected([f"unknown :type :{kind} (expected :REQUEST, :RESPONSE or :LOG)"])
    target = form.get("target")
    if target is None:
        raise ActionRejected([":target is missing (expected one of "
                              + ", ".join(f":{t}" for t in TARGETS) + ")"])
    if not isinstance(target, Keyword) or target not in REQUEST_MODELS:
        raise ActionRejected([f"unknown :target {print_value(target)} (expected one of "
                              + ", ".join(f":{t}" for t in TARGETS) + ")"])
    return REQUEST_MODELS[target]


def validate_action(form: Mapping[str, Any], tools: ToolRegistry | None = None) -> Action:
    """Turn a read plist into a typed Action, or raise ActionRejected with every reason."""
    if not isinstance(form, Mapping):
        raise ActionRejected(["an action must be a property list"])
    approvals = _approval_keys(form)
    if approvals:
        raise ActionRejected([
            f"a model cannot approve its own action (found {', '.join(approvals)}); "
            "only a person can approve"])
    model = _model_for(form)
    try:
        action = model.model_validate(dict(form))
    except ValidationError as error:
        raise ActionRejected(_describe(error)) from None
    if isinstance(action, ToolCall):
        action = _check_tool(action, tools)
    return action


def _check_tool(action: ToolCall, tools: ToolRegistry | None) -> ToolCall:
    if tools is None:
        raise ActionRejected([f"no tools are registered, so :tool {action.tool!r} cannot run"])
    try:
        args = tools.validate_call(action.tool, action.args)
    except ValueError as error:
        raise ActionRejected([str(error)]) from None
    return action.model_copy(update={"args": args})


def reply_action(channel: str, chat_id: str, text: str,
                 buffer: str = "*opencortex-chat*") -> Action:
    """The action that says TEXT back on CHANNEL to CHAT_ID."""
    request, target = Keyword("request"), Keyword(channel)
    if channel == "emacs":
        return EmacsInsert(type=request, target=target, action=Keyword("insert-at-end"),
                           buffer=buffer, text=text)
    if channel in ("telegram", "signal"):
        return ChatIdMessage(type=request, target=target, chat_id=chat_id, text=text)
    if channel == "matrix":
        return MatrixMessage(type=request, target=target, room_id=chat_id, text=text)
    return CliPrint(type=request, target=Keyword("cli"), text=text)

