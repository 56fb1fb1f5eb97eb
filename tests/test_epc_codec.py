"""`epc_codec.encode_message` writes exactly what python-epc's encoder writes."""

from __future__ import annotations

from epc.handler import encode_message as python_epc_encode, unpack_message
from hypothesis import example, given, settings, strategies as st
from sexpdata import Symbol

from opencortex.epc_codec import _plain_call, decode_message, encode_message

class Named:
    """A symbol's name, made a sexpdata Symbol in the test (`symbols`), not by the strategy:
    Symbol is a str, and Hypothesis's shrinker (6.170) took a drawn Symbol for one of its
    own text choices and failed on it (KeyError: Symbol), hiding what it was shrinking."""

    def __init__(self, name: str):
        self.name = name


def symbols(value):
    """VALUE with every Named in it made a Symbol."""
    if isinstance(value, Named):
        return Symbol(value.name)
    if isinstance(value, list):
        return [symbols(item) for item in value]
    if isinstance(value, tuple):
        return tuple(symbols(item) for item in value)
    if isinstance(value, dict):
        return {key: symbols(item) for key, item in value.items()}
    return value


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | \
    st.sampled_from(["", "a\\b", 'say "hi"', "\b\f\n\r\t", "(paren) [x] ;c #h ?q 'a `b ,c",
                     "é 🌍 世界", ":keyword"])
ATOMS = (TEXT | TEXT.map(lambda t: Named(t or "x")) | st.integers() | st.floats(allow_nan=False)
         | st.booleans() | st.none())
VALUES = st.recursive(ATOMS, lambda inner: st.lists(inner, max_size=4)
                      | st.tuples(inner, inner)
                      | st.dictionaries(st.text(alphabet="abc-xyz", min_size=1, max_size=8),
                                        inner, max_size=3), max_leaves=20)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["call", "return", "return-error", "epc-error", "methods"]),
       st.lists(VALUES, max_size=4))
def test_the_same_bytes_as_python_epc(name, args):
    args = symbols(args)
    assert encode_message(name, *args) == python_epc_encode(name, *args)


def test_the_messages_the_kernel_sends():
    for message in [("call", 3, Symbol("opencortex-stream"), ["id", "chunk", "* Reply\n\"x\""]),
                    ("return", 1, [Symbol(":turn-id"), "abc", Symbol(":queued"), 0]),
                    ("return", 2, True), ("return-error", 5, "no such method: x"),
                    ("epc-error", [], "malformed EPC message"),
                    ("return", 9, [[Symbol("authenticate"), [], ""]]),
                    ("return", 4, {"turn": 3, "can-send": True, "warning": None})]:
        assert encode_message(*message) == python_epc_encode(*message)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["call", "return", "return-error"]),
       st.integers(0, 10**15) | st.sampled_from([[], "x"]),
       st.lists(VALUES, max_size=3))
@example("call", 0, [Named("NAN")])
def test_reads_what_python_epc_reads(name, uid, args):
    """Compared by repr: a symbol named NAN reads as the float nan on both sides, and
    nan != nan (that was the failure the shrinker hid); repr also tells 1 from True."""
    frame = python_epc_encode(name, uid, *symbols(args))[6:]
    assert repr(decode_message(frame)) == repr(unpack_message(frame))


def test_a_plain_return_is_read_without_sexpdata():
    for frame in (b"(return 12 t)", b"(return 12 nil)", b"(return 12 t)\n",
                  b"(return 12 tt)", b"(return 12 t) (x)", b"(return  12 t)"):
        try:
            expected = unpack_message(frame)
        except Exception as error:              # sexpdata refuses trailing forms
            expected = type(error)
        try:
            got = decode_message(frame)
        except Exception as error:
            got = type(error)
        assert got == expected, frame


PLAIN_ARGS = st.lists(TEXT | st.integers(-10**14, 10**14) | st.none() | st.just(True), max_size=4)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 10**15 - 1), st.text(alphabet="abcz-09", min_size=1, max_size=12)
       .filter(lambda m: m[0].isalpha()), PLAIN_ARGS)
def test_a_call_with_plain_arguments_is_read_as_python_epc_reads_it(uid, method, args):
    """A call is read without sexpdata when its arguments are plain (strings without a
    backslash, integers, nil, t), and always as python-epc's own reader reads it."""
    frame = python_epc_encode("call", uid, Symbol(method), args)[6:]
    assert decode_message(frame) == unpack_message(frame)
    plain = all(not isinstance(a, str) or "\\" not in a and '"' not in a and not any(
        c in a for c in "\b\f\r\t") and "\n" not in a for a in args)
    assert (_plain_call(frame) is not None) == plain


def test_frames_near_a_plain_call_are_left_to_sexpdata():
    for frame in (b'(call 12 x ("a\\"b"))', b'(call 12 x (12abc))', b'(call 12 x (tt nil))',
                  b'(call 12 X ("a"))', b'(call 12 x "a")', b'(call 12 x ("a") 3)',
                  b'(call 12 x ("a"))(x)', b'(call 12 x ("\xff"))', b'(call -1 x ())'):
        assert _plain_call(frame) is None, frame
    long_uid = b'(call 1000000000000000 x ())'        # past 15 digits: sexpdata reads it
    assert _plain_call(long_uid) is None and decode_message(long_uid) == unpack_message(long_uid)
    assert decode_message(b'(call 7 x ("multi\nline" -3 nil t))\n') == (
        "call", 7, [Symbol("x"), ["multi\nline", -3, [], True]])


def test_an_error_emacs_returns_is_worded_as_emacs_would():
    from sexpdata import Symbol
    from opencortex.epc_connection import emacs_error
    assert emacs_error([Symbol("error"), "Buffer *notes* is read-only"]) == \
        "Buffer *notes* is read-only"
    assert emacs_error([Symbol("wrong-type-argument"), Symbol("stringp"), 5]) == \
        "wrong-type-argument: stringp, 5"
    assert emacs_error([Symbol("quit")]) == "quit"
    assert emacs_error("plain text") == "plain text"
