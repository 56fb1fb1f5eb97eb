"""The ChatEvent wire's frames: what a client may send, what the kernel sends back.

Version "1.1.0" (1.1: the ``thinking`` event; a client ignores events it does not
know).  Every frame is one JSON object in one WebSocket text frame.

Client → kernel: ``{"action": A, "version": "1.1.0", "data": {...}}`` where A is
- ``auth``: ``token`` (unless given in the ``Authorization: Bearer`` header),
  optional ``session_id`` and ``last_sequence`` to resume a session;
- ``message``: ``content``, optional ``mode`` ("chat", the only one),
  ``correlation_id`` and ``thread``;
- ``abort``: optional ``correlation_id`` (else the session's oldest turn in
  flight) and ``thread``;
- ``approve`` / ``deny``: ``approval_id``, optional ``digest`` (checked when given);
- ``command``: ``content`` (a slash command), optional ``thread`` and ``correlation_id``.

Kernel → client: ``{"event": E, "version", "sequence", "timestamp", "data"}``
with E one of `EVENTS`.  ``sequence`` increases strictly per session (so per
connection too); ``timestamp`` is ISO 8601 UTC.  A frame the kernel cannot
use is answered with an ``error`` event, code INVALID_MESSAGE; the connection
stays open.  A version with another major number is refused the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

VERSION = "1.1.0"
MAJOR = VERSION.split(".", 1)[0]

ACTIONS = ("auth", "message", "abort", "approve", "deny", "command")
EVENTS = ("session", "chunk", "thinking", "message", "error", "approval", "status", "done",
          "heartbeat")
ERROR_CODES = ("RATE_LIMITED", "STREAM_TIMEOUT", "LLM_UNAVAILABLE", "INVALID_MESSAGE",
               "SESSION_EXPIRED", "TURN_FAILED")
MODES = ("chat",)
DEFAULT_THREAD = "wire"

ID_LIMIT = 128              # characters of a correlation, session or approval id
THREAD_LIMIT = 200          # characters of a thread name
SEMVER = re.compile(r"(\d+)\.(\d+)\.(\d+)")
PRINTABLE_ID = re.compile(r"[\x21-\x7e]+")


class ProtocolError(ValueError):
    """A client frame was refused; the message says what to fix (INVALID_MESSAGE)."""

    def __init__(self, message: str, correlation_id: str | None = None):
        super().__init__(message)
        self.correlation_id = correlation_id


@dataclass(frozen=True)
class ClientFrame:
    """One valid client frame: its action and its checked data."""

    action: str
    data: dict[str, Any]

    @property
    def correlation_id(self) -> str | None:
        return self.data.get("correlation_id")


# -- reading client frames -------------------------------------------------------


def parse_frame(raw: str | bytes, *, max_content_bytes: int) -> ClientFrame:
    """The frame RAW holds, checked; ProtocolError naming the first problem."""
    if isinstance(raw, bytes):
        raise ProtocolError("send text frames holding JSON, not binary frames")
    try:
        frame = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        raise ProtocolError("the frame is not valid JSON") from None
    if not isinstance(frame, dict):
        raise ProtocolError(f"a frame must be a JSON object, not {_kind(frame)}")
    data = frame.get("data", {})
    correlation = data.get("correlation_id") if isinstance(data, dict) else None
    correlation = correlation if isinstance(correlation, str) else None
    try:
        return _checked(frame, data, max_content_bytes)
    except ProtocolError as error:
        raise ProtocolError(str(error), correlation) from None


def _checked(frame: dict[str, Any], data: Any, max_content_bytes: int) -> ClientFrame:
    action = frame.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        raise ProtocolError(f"unknown action {_shown(action)}; expected one of "
                            + ", ".join(ACTIONS))
    check_version(frame.get("version"))
    if not isinstance(data, dict):
        raise ProtocolError(f"data must be a JSON object, not {_kind(data)}")
    return ClientFrame(action, CHECKS[action](data, max_content_bytes))


def check_version(version: Any) -> None:
    """Accept VERSION, or any version with its major number."""
    if not isinstance(version, str):
        raise ProtocolError(f"version is missing; send \"version\": \"{VERSION}\"")
    match = SEMVER.fullmatch(version)
    if match is None or match.group(1) != MAJOR:
        raise ProtocolError(f"version {_shown(version)} is not supported; this kernel "
                            f"speaks {VERSION}")


def _string(data: dict[str, Any], key: str, *, required: bool = False,
            limit: int = ID_LIMIT, pattern: re.Pattern[str] | None = PRINTABLE_ID) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise ProtocolError(f"data.{key} is missing")
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"data.{key} must be a string, not {_kind(value)}")
    if not value or len(value) > limit:
        raise ProtocolError(f"data.{key} must be 1 to {limit} characters long")
    if pattern is not None and not pattern.fullmatch(value):
        raise ProtocolError(f"data.{key} must be printable ASCII without spaces")
    return value


def _content(data: dict[str, Any], max_bytes: int) -> str:
    content = data.get("content")
    if content is None:
        raise ProtocolError("data.content is missing")
    if not isinstance(content, str):
        raise ProtocolError(f"data.content must be a string, not {_kind(content)}")
    if not content.strip():
        raise ProtocolError("data.content is blank; send some text")
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ProtocolError(f"data.content is {size} bytes; the limit is {max_bytes} bytes")
    return content


def _thread(data: dict[str, Any]) -> str:
    name = data.get("thread")
    if name is None:
        return DEFAULT_THREAD
    if not isinstance(name, str) or not name.strip() or len(name) > THREAD_LIMIT \
            or any(c in name for c in "\r\n\0"):
        raise ProtocolError(f"data.thread must be one non-blank line of at most "
                            f"{THREAD_LIMIT} characters")
    return name


def _auth(data: dict[str, Any], _: int) -> dict[str, Any]:
    token = _string(data, "token", limit=1024, pattern=None)
    last = data.get("last_sequence", 0)
    if isinstance(last, bool) or not isinstance(last, int) or last < 0:
        raise ProtocolError("data.last_sequence must be a whole number, 0 or more")
    return {"token": token, "session_id": _string(data, "session_id"), "last_sequence": last}


def _message(data: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    mode = data.get("mode", "chat")
    if mode not in MODES:
        raise ProtocolError(f"mode {_shown(mode)} is not supported; use \"chat\"")
    return {"content": _content(data, max_bytes), "mode": mode, "thread": _thread(data),
            "correlation_id": _string(data, "correlation_id")}


def _abort(data: dict[str, Any], _: int) -> dict[str, Any]:
    thread = _thread(data) if "thread" in data else None
    return {"correlation_id": _string(data, "correlation_id"), "thread": thread}


def _answer(data: dict[str, Any], _: int) -> dict[str, Any]:
    return {"approval_id": _string(data, "approval_id", required=True),
            "digest": _string(data, "digest"), "correlation_id": _string(data, "correlation_id")}


def _command(data: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    content = _content(data, max_bytes).strip()
    if not content.startswith("/"):
        raise ProtocolError("data.content of a command starts with / (send other text "
                            "as a message)")
    return {"content": content, "thread": _thread(data),
            "correlation_id": _string(data, "correlation_id")}


CHECKS = {"auth": _auth, "message": _message, "abort": _abort, "approve": _answer,
          "deny": _answer, "command": _command}


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """VALUE for an error message: JSON, at most 40 characters."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:39] + "…"


# -- writing kernel events -------------------------------------------------------


def timestamp() -> str:
    """Now, ISO 8601 UTC with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_frame(event: str, sequence: int, data: dict[str, Any]) -> bytes:
    """One event as the UTF-8 bytes of a text frame.  Text holding lone surrogates
    (undecodable model output) is sent with JSON escapes instead, so the frame is
    always valid UTF-8."""
    frame = {"event": event, "version": VERSION, "sequence": sequence,
             "timestamp": timestamp(), "data": data}
    try:
        return json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(frame, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_data(code: str, message: str, *, correlation_id: str | None = None,
               turn_id: str | None = None,
               retry_after_seconds: float | None = None) -> dict[str, Any]:
    """The data of an ``error`` event."""
    data: dict[str, Any] = {"code": code, "message": message,
                            "correlation_id": correlation_id, "turn_id": turn_id}
    if retry_after_seconds is not None:
        data["retry_after_seconds"] = retry_after_seconds
    return data
