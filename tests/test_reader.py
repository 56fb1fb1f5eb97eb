"""Tests for opencortex.reader: model text -> one plist as data, and back."""

from __future__ import annotations

import math

import pytest
import sexpdata
from hypothesis import given, settings
from hypothesis import strategies as st

from opencortex.reader import (
    Keyword, Reading, ReadError, Symbol, print_plist, print_value, read_plist,
    read_reply)


def same(a, b) -> bool:
    """Equality that also demands equal types (Keyword vs str, int vs float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            type(k) is str and same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def error_of(text: str, **caps) -> ReadError:
    with pytest.raises(ReadError) as info:
        read_reply(text, **caps)
    return info.value


# ------------------------------------------------------------ basic values


def test_reads_a_simple_action():
    form = read_plist('(:type :request :text "hi")')
    assert same(form, {"type": Keyword("request"), "text": "hi"})


def test_keywords_are_case_insensitive_for_keys_and_values():
    form = read_plist('(:TYPE :Request :Chat-ID "x")')
    assert same(form, {"type": Keyword("request"), "chat-id": "x"})


def test_atoms_map_to_python_values():
    form = read_plist('(:a t :b T :c nil :d NIL :e () :f 42 :g -1.5 :h foo :i Bar)')
    assert same(form, {"a": True, "b": True, "c": None, "d": None, "e": [],
                       "f": 42, "g": -1.5, "h": Symbol("foo"), "i": Symbol("Bar")})


def test_string_escapes_are_decoded():
    form = read_plist(r'(:s "a\"b\\c\nd\te")')
    assert form["s"] == 'a"b\\c\nd\te'


def test_strings_keep_literal_newlines_and_unicode():
    form = read_plist('(:s "line1\nline2 ✓ 😀 \x00")')
    assert form["s"] == "line1\nline2 ✓ 😀 \x00"


def test_nested_plists_lists_and_vectors():
    form = read_plist('(:sub (:x 1 :y (:z "deep")) :l (1 "two" :three) :v [:a 1])')
    assert same(form, {
        "sub": {"x": 1, "y": {"z": "deep"}},
        "l": [1, "two", Keyword("three")],
        "v": [Keyword("a"), 1],  # a vector is always a list, never a plist
    })


def test_comments_inside_the_form_are_skipped():
    form = read_plist('(:a 1 ; the answer (:not a form)\n :b "x;y")')
    assert same(form, {"a": 1, "b": "x;y"})


def test_keyword_and_symbol_reprs():
    assert repr(Keyword("REQ")) == "Keyword('req')"
    assert repr(Symbol("Foo")) == "Symbol('Foo')"


# ------------------------------------------------------- fences and prose


@pytest.mark.parametrize("fence", ["```lisp", "```elisp", "```emacs-lisp", "```"])
def test_markdown_fences_are_tolerated(fence):
    text = f"{fence}\n(:type :request :text \"hi\")\n```"
    reading = read_reply(text)
    assert same(reading.form, {"type": Keyword("request"), "text": "hi"})
    assert reading.ignored == f"{fence}\n```"


def test_prose_around_the_form_is_reported_as_ignored():
    text = 'Sure (happy to help)! Here it is:\n  (:type :done)  \nAnything else?'
    reading = read_reply(text)
    assert same(reading.form, {"type": Keyword("done")})
    assert reading.ignored == "Sure (happy to help)! Here it is:\nAnything else?"
    assert text[reading.start:reading.end] == "(:type :done)"


def test_bare_form_has_nothing_ignored():
    reading = read_reply("(:type :done)")
    assert reading == Reading(form={"type": Keyword("done")}, ignored="",
                              start=0, end=13)


def test_form_text_inside_strings_is_not_a_second_form():
    form = read_plist('(:text "write (:type :x) like this")')
    assert form == {"text": "write (:type :x) like this"}


def test_two_forms_are_refused():
    err = error_of("(:type :a)\nand also\n(:type :b)")
    assert "two forms" in err.reason
    assert err.position == 20


def test_no_plist_is_refused():
    for text in ["", "just prose", "(message \"hi\")", "[:a 1]", "( : a)"]:
        assert "no plist found" in error_of(text).reason


# ------------------------------------------------------------------- caps


def test_size_cap_counts_utf8_bytes():
    form = '(:s "' + "é" * 10 + '")'  # 27 bytes, 17 characters
    assert read_plist(form, max_bytes=27) == {"s": "é" * 10}
    err = error_of(form, max_bytes=26)
    assert "26-byte limit" in err.reason


def test_size_cap_is_checked_before_scanning():
    err = error_of("(:a " + "(" * 5000, max_bytes=100)
    assert "limit" in err.reason


def test_depth_cap():
    assert read_plist("(:a (((1))))", max_depth=4) == {"a": [[[1]]]}
    err = error_of("(:a (((1))))", max_depth=3)
    assert "deeper than 3" in err.reason
    assert err.position == 6


def test_thousand_deep_nesting_is_a_read_error():
    err = error_of("(:a " + "(" * 1000 + ")" * 1001)
    assert "deeper than 64" in err.reason


def test_unbalanced_deep_nesting_is_a_read_error():
    assert "deeper" in error_of("(:a " + "[" * 1000).reason


def test_deepest_allowed_cap_reads_without_recursion_trouble():
    deep = "(:a " + "(:b " * 199 + "1" + ")" * 200
    form = read_plist(deep, max_depth=200)
    for _ in range(200):
        form = form.get("a", form.get("b"))
    assert form == 1


def test_bad_caps_are_caller_errors():
    with pytest.raises(ValueError):
        read_reply("(:a 1)", max_depth=0)
    with pytest.raises(ValueError):
        read_reply("(:a 1)", max_depth=201)
    with pytest.raises(ValueError):
        read_reply("(:a 1)", max_bytes=-1)
    with pytest.raises(ValueError):
        read_reply("(:a 1)", max_elements=0)


def test_element_cap_counts_atoms_strings_lists_and_comments():
    text = '(:a (1 "two") ; note\n :b x)'  # ( :a ( 1 "two" ; :b x -> 8 elements
    assert read_plist(text, max_elements=8) == {"a": [1, "two"], "b": Symbol("x")}
    err = error_of(text, max_elements=7)
    assert "more than 7 elements" in err.reason
    assert err.position == text.index("x)")


def test_a_megabyte_of_bare_symbols_is_refused_at_the_element_cap():
    text = "(:type :response :text \"x\" :junk (" + "a " * 500_000 + "))"
    err = error_of(text)
    assert "more than 10000 elements" in err.reason
    assert err.position < 30_000


def test_lone_surrogates_are_refused_with_their_position():
    text = '(:type :response :text "caf\udce9")'
    err = error_of(text)
    assert "not valid text" in err.reason and err.position == text.index("\udce9")
    assert "not valid text" in error_of("\ud800 (:a 1)").reason  # outside the form too


def test_non_text_is_refused():
    assert "str" in error_of(b"(:a 1)").reason


# ------------------------------------------------------ refused syntax


@pytest.mark.parametrize("syntax, position", [
    ("#.(delete-file \"x\")", 4), ("#'car", 4), ("#<buffer x>", 4),
    ("#(1 2)", 4), ("#:g1", 4), ("#x10", 4), ("foo#bar", 7),
    ("`(a ,b)", 4), ("(a ,b)", 7), ("'quoted", 4), ("?c", 4),
    ("foo\\ bar", 7), ("(1 . 2)", 7), ("(:x : )", 8),
])
def test_reader_syntax_is_refused(syntax, position):
    err = error_of(f"(:a {syntax})")
    assert err.position == position
    assert "not allowed" in err.reason or "not supported" in err.reason \
        or "needs a name" in err.reason


@pytest.mark.parametrize("prefix", ["#.", "#", "#'", "#s", "#@1", "x#."])
def test_hash_syntax_glued_to_the_form_is_refused(prefix):
    err = error_of(f"{prefix}(:type :response :text \"x\")")
    assert "directly before the form" in err.reason
    assert err.position == prefix.index("#")


@pytest.mark.parametrize("text", ["# Heading\n(:a 1)", "issue #3 (:a 1)", "#. (:a 1)",
                                  "```\n#\n(:a 1)\n```"])
def test_a_hash_in_prose_apart_from_the_form_is_fine(text):
    assert read_plist(text) == {"a": 1}


def test_reader_syntax_inside_strings_is_fine():
    form = read_plist("(:a \"#.(x) `y ,z 'w ?c \\\\ a . b\")")
    assert form == {"a": "#.(x) `y ,z 'w ?c \\ a . b"}


def test_non_finite_numbers_are_refused():
    for atom in ["nan", "inf", "-infinity", "1e999"]:
        err = error_of(f"(:a {atom})")
        assert "not finite" in err.reason
        assert err.position == 4


# ---------------------------------------------------------- plist shape


def test_duplicate_keys_name_the_key_and_position():
    err = error_of("(:type :a :TYPE :b)")
    assert "duplicate key :type" in err.reason
    assert err.position == 10


def test_odd_length_names_the_dangling_key():
    err = error_of("(:type :a :text)")
    assert "key :text has no value" in err.reason
    assert err.position == 10


def test_non_keyword_at_key_position():
    err = error_of('(:type :a "text" 1)')
    assert "expected a keyword at element 3" in err.reason
    assert "found a string" in err.reason
    assert err.position == 10


def test_nested_plist_errors_point_into_the_nesting():
    err = error_of("(:a (1 2) :b (:x 1 ; note\n :x 2))")
    assert "duplicate key :x" in err.reason
    assert err.position == 27


# ---------------------------------------------------------- broken text


def test_unterminated_string():
    err = error_of('(:type :a :text "hello)')
    assert "unterminated string" in err.reason
    assert err.position == 16


def test_missing_paren_points_at_the_unclosed_bracket():
    err = error_of("(:type :a :items (1 2")
    assert "never closed" in err.reason
    assert err.position == 17


def test_missing_paren_before_a_fence():
    err = error_of("```lisp\n(:type :a\n```\nok?")
    assert "not closed before the ``` fence" in err.reason
    assert err.position == 18


def test_mismatched_brackets():
    err = error_of("(:a [1 2))")
    assert "use ']'" in err.reason
    assert err.position == 8


def test_error_string_format():
    assert str(ReadError("bad", 3)) == "bad (at character 3)"
    assert str(ReadError("bad")) == "bad"
    assert ReadError("bad", 3).reason == "bad"


# --------------------------------------------------------------- printing


def test_print_plist_example():
    assert print_plist({"type": Keyword("request"), "text": "hi"}) == \
        '(:type :request :text "hi")'


def test_print_values():
    assert print_value(None) == "nil"
    assert print_value(False) == "nil"
    assert print_value(True) == "t"
    assert print_value(Symbol("foo")) == "foo"
    assert print_value(0.1) == "0.1"
    assert print_value(-7) == "-7"
    assert print_value(["a", 1]) == '("a" 1)'
    assert print_value((1, 2)) == "(1 2)"
    assert print_value({"x": {"y": 1}}) == "(:x (:y 1))"
    assert print_value('a"b\\c\nd') == '"a\\"b\\\\c\nd"'


def test_list_starting_with_a_keyword_prints_as_a_vector():
    value = [Keyword("a"), 1]
    assert print_value(value) == "[:a 1]"
    assert same(read_plist(print_plist({"v": value})), {"v": value})


@pytest.mark.parametrize("value", [
    {}, {"a": {}}, {"has space": 1}, {"": 1}, {"a": Keyword("x y")},
    {"a": Symbol("t")}, {"a": Symbol("12")}, {"a": Symbol("nan")},
    {"a": Symbol(":k")}, {"a": Symbol("?c")}, {"a": Symbol(".")},
    {"a": math.nan}, {"a": math.inf}, {"A": 1, "a": 2}, {"a": "caf\udce9"},
])
def test_unprintable_values_are_refused(value):
    with pytest.raises(ValueError):
        print_plist(value)


def test_unknown_types_are_refused():
    with pytest.raises(TypeError):
        print_plist({"a": object()})
    with pytest.raises(TypeError):
        print_plist([1, 2])
    with pytest.raises(TypeError):
        print_plist({1: 2})


# ------------------------------------------------------ property tests

NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
SYMBOLS = st.from_regex(r"x[A-Za-z0-9*!?<>=/+-]{0,8}", fullmatch=True).map(Symbol)
SCALARS = st.one_of(
    st.text(), NAMES.map(Keyword), SYMBOLS, st.integers(),
    st.floats(allow_nan=False, allow_infinity=False), st.just(True), st.none())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(NAMES, inner, min_size=1, max_size=5)),
    max_leaves=30)
ACTIONS = st.dictionaries(NAMES, VALUES, min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_print_then_read_is_identity(action):
    assert same(read_plist(print_plist(action)), action)


@settings(max_examples=100, deadline=None)
@given(ACTIONS)
def test_printed_form_reads_back_inside_fence_and_prose(action):
    text = f"Here you go:\n```elisp\n{print_plist(action)}\n```\nDone."
    reading = read_reply(text)
    assert same(reading.form, action)
    assert reading.ignored == "Here you go:\n```elisp\n```\nDone."


NUMBERISH = st.text("0123456789+-._eEiInNfFaAtTyYx\u00a0\u0663\uff11", min_size=1,
                    max_size=10).filter(lambda t: t[0] not in ":?" and t != ".")


def sexpdata_atom(token: str):
    """What sexpdata (the reader's former parser) made of the atom TOKEN."""
    node = sexpdata.Parser(token, nil=None, true=None).parse()[0]
    return str(node) if isinstance(node, sexpdata.Symbol) else node


@settings(max_examples=500, deadline=None, derandomize=True)
@given(NUMBERISH)
def test_atoms_read_as_sexpdata_read_them(token):
    try:
        value = read_plist(f"(:a {token})")["a"]
    except ReadError as err:
        assert "not finite" in err.reason
        assert not math.isfinite(sexpdata_atom(token))
        return
    expected = sexpdata_atom(token)
    if isinstance(expected, str) and expected.lower() in ("t", "nil"):
        return  # t/nil are constants here
    assert type(value) in (type(expected), Symbol) and value == expected


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["a", "é", "\n", "\\\\", '\\"', "\\n", "\\t", "\\r",
                                 "\\b", "\\f", "\\d", "\\x", "\\\n", "\\é"]),
                max_size=30).map("".join))
def test_strings_decode_escapes_as_sexpdata_does(body):
    assert read_plist(f'(:s "{body}")')["s"] == sexpdata.loads(f'"{body}"')


def check_total(text: str) -> None:
    """read_reply either returns a well-formed Reading or raises ReadError."""
    try:
        reading = read_reply(text, max_depth=8)
    except ReadError as err:
        assert err.position is None or 0 <= err.position <= len(text)
        return
    assert isinstance(reading.form, dict)
    assert text[reading.start] == "(" and text[reading.end - 1] == ")"


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_arbitrary_text_reads_or_raises_read_error(text):
    check_total(text)


FRAGMENTS = st.sampled_from([
    "(", ")", "[", "]", ":type", ":TEXT", ":", '"', "\\", '"hi"', '"a\\"b"',
    " ", "\n", "t", "nil", "NIL", "#", "#.", "'", "`", ",", "?a", ".", ";",
    "1", "-2.5", "nan", "1e999", "```lisp\n", "```", "prose", "é😀", "\x00",
    "(:a 1)", "(:", "foo", "()", "[:a 1]",
])


@settings(max_examples=1000, deadline=None)
@given(st.lists(FRAGMENTS, max_size=40).map("".join))
def test_plist_like_text_reads_or_raises_read_error(text):
    check_total(text)
