"""EPC messages to bytes and back: what python-epc's `encode_message` writes and
`unpack_message` reads, at a fraction of the cost.

python-epc prints a message with `sexpdata.dumps`, which dispatches every value
through `functools.singledispatch` and wraps lists in helper objects: ~30 µs for
a streamed chunk, on the event loop, several times a turn.  This printer covers
the values the kernel sends (strings, symbols, ints, floats, t/nil, lists,
tuples, mappings as plists) with the same output, byte for byte (a property test
holds it to `sexpdata.dumps`); anything else goes to sexpdata as before.
Reading: the commonest messages are recognised directly: Emacs's `(return UID t)`
(or nil) to a stream chunk or a status, and a call whose arguments are plain strings
(no backslash), integers, nil (or ()) and t, as `(call UID send-message ("chat" "text"))`
(sexpdata takes about 17 µs for that one); everything else is read by sexpdata.
A property test holds both to python-epc's `unpack_message`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import sexpdata
from epc.handler import unpack_message
from sexpdata import Symbol

STRING_SPECIALS = re.compile(r'[\\"\b\f\n\r\t]')
STRING_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\b", "\\b"), ("\f", "\\f"),
                  ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
SYMBOL_SPECIALS = re.compile(r"""[\\'`"()\[\] ,?;#]""")
PLAIN_RETURN = re.compile(rb"\(return (\d{1,15}) (t|nil)\)\n?")
_ATOM = r'"[^"\\]*"|-?[0-9]{1,15}|nil|\(\)|t'
PLAIN_CALL = re.compile(rf"\(call ([0-9]{{1,15}}) ([a-z][a-z0-9-]{{0,63}}) "
                        rf"\(((?:{_ATOM})(?: (?:{_ATOM}))*)?\)\)\n?")
PLAIN_ATOM = re.compile(r'"([^"\\]*)"|(-?[0-9]{1,15})|(nil|\(\))|t')


def encode_message(name: str, *args: Any) -> bytes:
    """The EPC frame of (NAME ARGS...): 6 hex digits of length, the form, a newline."""
    data = f"({_symbol(name)}{''.join(' ' + _value(a) for a in args)})".encode("utf-8")
    return b"%06x%s\n" % (len(data) + 1, data)


def _string(text: str) -> str:
    if STRING_SPECIALS.search(text):
        for raw, quoted in STRING_ESCAPES:
            text = text.replace(raw, quoted)
    return f'"{text}"'


def _symbol(name: str) -> str:
    if SYMBOL_SPECIALS.search(name):
        return sexpdata.dumps(Symbol(name))
    return name


def _value(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is Symbol:
        return _symbol(value)
    if value is None or value is False:
        return "()"
    if value is True:
        return "t"
    if kind is int or kind is float:
        return str(value)
    if kind is list or kind is tuple:
        return "(" + " ".join(_value(item) for item in value) + ")"
    if kind is dict:
        return _plist(value)
    return sexpdata.dumps(value)


def _plist(mapping: Mapping[str, Any]) -> str:
    return "(" + " ".join(f"{_symbol(':' + key)} {_value(item)}"
                          for key, item in mapping.items()) + ")"


def decode_message(frame: bytes) -> tuple[str, Any, list[Any]]:
    """FRAME's (name, uid, args), as python-epc's `unpack_message` gives them (sexpdata's
    errors when it is not a form)."""
    plain = PLAIN_RETURN.fullmatch(frame)
    if plain:
        return "return", int(plain.group(1)), [True if plain.group(2) == b"t" else []]
    return _plain_call(frame) or unpack_message(frame)


def _plain_call(frame: bytes) -> tuple[str, int, list[Any]] | None:
    """FRAME read as a call with plain arguments (see the module notes), or None."""
    if not frame.startswith(b"(call "):
        return None
    try:
        call = PLAIN_CALL.fullmatch(frame.decode("utf-8"))
    except UnicodeDecodeError:
        return None
    if call is None:
        return None
    args: list[Any] = []
    for atom in PLAIN_ATOM.finditer(call.group(3) or ""):
        text, number, nil = atom.groups()
        args.append(text if text is not None else int(number) if number is not None
                    else [] if nil is not None else True)
    return "call", int(call.group(1)), [Symbol(call.group(2)), args]
