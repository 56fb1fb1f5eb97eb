"""Typed actions, one model per target and action, deny by default.

A model reply, once read as a plist (see `opencortex.reader`), becomes one of
the actions below or is rejected with the reasons.  Nothing that is not
described here can be accepted: an unknown type, target or action, a missing
or mistyped field, or any extra field is a rejection.  Keys that look like an
approval are rejected outright: only a person can approve an action.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from opencortex.excerpt import excerpt
from opencortex.plain_errors import plain_reasons
from opencortex.plist_syntax import SURROGATES, Keyword, Symbol
from opencortex.printer import print_plist, print_value
from opencortex.tools import ToolRegistry

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
    """Let a Keyword through; refuse anything else (a string, a symbol...)."""
    if not isinstance(value, Keyword):
        raise ValueError(f"must be a keyword (:name), not {excerpt(value, 40)}")
    return value


def _plain_text(value: Any) -> Any:
    """Let a string through; refuse a keyword or bare symbol standing for one,
    and text that could not be stored (lone surrogates: undecodable bytes)."""
    if isinstance(value, (Keyword, Symbol)):
        raise ValueError(f"must be a string in double quotes, not {excerpt(value, 40)}")
    if isinstance(value, str) and SURROGATES.search(value):
        raise ValueError("holds an undecodable byte (a lone surrogate); send plain text")
    return value


def _command_words(value: Any) -> Any:
    """A command: one string, or a list of strings (program and arguments)."""
    if isinstance(value, str) and not isinstance(value, (Keyword, Symbol)):
        return _plain_text(value)
    if isinstance(value, list) and value:
        for i, word in enumerate(value):
            if not isinstance(word, str) or isinstance(word, (Keyword, Symbol)):
                raise ValueError(f"must be a string or a list of strings in double quotes; "
                                 f"item {i + 1} is {excerpt(word, 40)}")
            _plain_text(word)
        return value
    raise ValueError(f"must be a string or a non-empty list of strings in double quotes, "
                     f"not {excerpt(value, 40)}")


def _tool_arguments(value: Any) -> Any:
    """Tool arguments: a plist; nil or () (or leaving :args out) means none."""
    if value is None or value == []:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("must be a plist of arguments like (:name value ...), or left "
                         f"out when the tool takes none; not {excerpt(value, 40)}")
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
        """This action as reader-shaped data: keyword values become Keywords;
        empty plists (no tool arguments) are left out, as a model writes them."""
        data = self.model_dump(by_alias=True, exclude_none=True)
        for key in ("type", "target", "action", "level"):
            if key in data:
                data[key] = Keyword(data[key])
        return {key: value for key, value in data.items() if value != {}}

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
    args: Annotated[dict[str, Any], BeforeValidator(_tool_arguments)] = Field(
        default_factory=dict)

    @property
    def reply_text(self) -> None:
        return None


class ShellCommand(Action):
    """Run a command: never accepted outright, a person must approve it."""
    type: kw("request")
    target: kw("shell")
    cmd: Annotated[Union[str, list[str]], BeforeValidator(_command_words)]
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
    """Every key (nested plists included) by which a model would approve itself."""
    found = []
    for key, value in form.items():
        name = str(key)[:40]
        if str(key).lower() in APPROVAL_KEYS:
            found.append(f"{path}:{name}")
        if isinstance(value, Mapping):
            found.extend(_approval_keys(value, f"{path}:{name} "))
    return found


def _model_for(form: Mapping[str, Any]) -> type[Action]:
    kind = form.get("type")
    if kind is None:
        raise ActionRejected([":type is missing (expected :REQUEST, :RESPONSE or :LOG)"])
    if not isinstance(kind, Keyword):
        raise ActionRejected([f":type must be a keyword such as :REQUEST, not "
                              f"{excerpt(kind, 40)}"])
    if kind in TYPE_MODELS:
        return TYPE_MODELS[kind]
    if kind != "request":
        raise ActionRejected([f"unknown :type {excerpt(kind, 40)} "
                              "(expected :REQUEST, :RESPONSE or :LOG)"])
    target = form.get("target")
    if target is None:
        raise ActionRejected([":target is missing (expected one of "
                              + ", ".join(f":{t}" for t in TARGETS) + ")"])
    if not isinstance(target, Keyword) or target not in REQUEST_MODELS:
        raise ActionRejected([f"unknown :target {excerpt(target, 40)} (expected one of "
                              + ", ".join(f":{t}" for t in TARGETS) + ")"])
    return REQUEST_MODELS[target]


def validate_action(form: Mapping[str, Any], tools: ToolRegistry | None = None) -> Action:
    """Turn a read plist into a typed Action, or raise ActionRejected with every reason."""
    if not isinstance(form, Mapping):
        raise ActionRejected(["an action must be a property list"])
    approvals = _approval_keys(form)
    if approvals:
        raise ActionRejected([
            f"a model cannot approve its own action (found {', '.join(approvals[:5])}"
            f"{' ...' if len(approvals) > 5 else ''}); only a person can approve"])
    model = _model_for(form)
    try:
        action = model.model_validate(dict(form))
    except ValidationError as error:
        raise ActionRejected(plain_reasons(error, unknown="is not a field of this action")) \
            from None
    if isinstance(action, ToolCall):
        action = _check_tool(action, tools)
    return action


def _check_tool(action: ToolCall, tools: ToolRegistry | None) -> ToolCall:
    if tools is None:
        raise ActionRejected([f"no tools are registered, so :tool {excerpt(action.tool, 60)} "
                              "cannot run"])
    try:
        args = tools.validate_call(action.tool, action.args)
    except ValueError as error:
        raise ActionRejected([str(error)]) from None
    return action.model_copy(update={"args": args})


def printed_reply(channel: str, chat_id: str, text: str,
                  buffer: str = "*opencortex-chat*") -> str:
    """`reply_action(CHANNEL, CHAT_ID, TEXT, BUFFER).printed()`, without building the
    action: what comes before the text is printed once per address (the echo backend
    answers every turn with one; built and printed in full it cost about 35 µs of the
    loop's time a turn)."""
    head = _reply_head(channel, chat_id, buffer)
    if head is None:
        return reply_action(channel, chat_id, text, buffer).printed()
    return head + print_value(text) + ")"


@lru_cache(maxsize=1024)
def _reply_head(channel: str, chat_id: str, buffer: str) -> str | None:
    """The printed reply action to an address up to its text (`(:type :request ...
    :text `), or None if the text is not what it prints last."""
    printed = reply_action(channel, chat_id, "", buffer).printed()
    head, tail = printed[:-3], printed[-3:]
    return head if tail == '"")' and head.endswith(" :text ") else None


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

