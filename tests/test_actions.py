import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from opencortex.actions import (ActionRejected, ChatIdMessage, CliPrint, EmacsInsert, Log,
                                MatrixMessage, Response, ShellCommand, ToolCall, _reply_head,
                                printed_reply, reply_action, validate_action)
from opencortex.plist_syntax import SURROGATES
from opencortex.reader import Keyword, read_plist
from opencortex.tools import Tool, ToolRegistry, default_tools


def action(text, tools=None):
    return validate_action(read_plist(text), tools)


def reasons(text, tools=None):
    with pytest.raises(ActionRejected) as caught:
        action(text, tools)
    return " | ".join(caught.value.reasons)


@pytest.mark.parametrize("text, model", [
    ('(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*opencortex-chat*" '
     ':text "* Hello")', EmacsInsert),
    ('(:type :request :target :telegram :chat-id "42" :text "hi")', ChatIdMessage),
    ('(:TYPE :REQUEST :TARGET :SIGNAL :CHAT-ID "+100" :TEXT "hi")', ChatIdMessage),
    ('(:type :REQUEST :target :matrix :room-id "!r:x" :text "hi")', MatrixMessage),
    ('(:type :REQUEST :target :cli :text "hi")', CliPrint),
    ('(:type :REQUEST :target :shell :cmd ("ls" "-l") :reason "look")', ShellCommand),
    ('(:type :RESPONSE :text "hi")', Response),
    ('(:type :LOG :text "noted" :level :info)', Log),
])
def test_valid_actions_are_typed(text, model):
    assert type(action(text)) is model


def test_to_plist_round_trips_through_the_reader():
    typed = action('(:type :REQUEST :target :telegram :chat-id "42" :text "hi \\"you\\"")')
    assert action(typed.printed()) == typed


@pytest.mark.parametrize("text, fragment", [
    ('(:target :cli :text "x")', ":type is missing"),
    ('(:type :ORDER :text "x")', "unknown :type :order"),
    ('(:type "request" :target :cli :text "x")', "must be a keyword"),
    ('(:type :REQUEST :text "x")', ":target is missing"),
    ('(:type :REQUEST :target :printer :text "x")', "unknown :target :printer"),
    ('(:type :REQUEST :target "cli" :text "x")', "unknown :target"),
    ('(:type :REQUEST :target :emacs :action :eval :buffer "b" :text "x")', ":action"),
    ('(:type :REQUEST :target :emacs :action :insert-at-end :text "x")', ":buffer is missing"),
    ('(:type :REQUEST :target :telegram :text "x")', ":chat-id is missing"),
    ('(:type :REQUEST :target :matrix :chat-id "1" :text "x")', ":room-id is missing"),
    ('(:type :REQUEST :target :cli :text 42)', ":text"),
    ('(:type :REQUEST :target :cli :text :hello)', "double quotes"),
    ('(:type :REQUEST :target :cli :text "x" :color "red")', ":color is not a field"),
    ('(:type :REQUEST :target :telegram :chat-id "" :text "x")', ":chat-id"),
])
def test_deny_by_default_with_reasons(text, fragment):
    assert fragment in reasons(text)


@pytest.mark.parametrize("key", ["approved", "APPROVED", "confirmed", "user-approved",
                                 "skip-approval", "authorized"])
def test_a_model_cannot_approve_its_own_action(key):
    text = f'(:type :REQUEST :target :shell :cmd "rm -rf /" :{key} t)'
    assert "cannot approve its own action" in reasons(text)


def test_approval_keys_are_found_when_nested():
    text = '(:type :REQUEST :target :tool :action :call :tool "clock" :args (:approved t))'
    assert "cannot approve" in reasons(text, default_tools())


class Weather(BaseModel):
    city: str
    days: int = 1


def weather_tools():
    return ToolRegistry([Tool("weather", "Forecast.", Weather, lambda a: "sunny")])


def test_tool_calls_must_name_a_registered_tool_with_typed_arguments():
    tools = weather_tools()
    call = action('(:type :REQUEST :target :tool :action :call :tool "weather" '
                  ':args (:city "Oslo" :days 3))', tools)
    assert isinstance(call, ToolCall) and call.args == {"city": "Oslo", "days": 3}
    assert 'unknown tool "rain"' in reasons(
        '(:type :REQUEST :target :tool :action :call :tool "rain")', tools)
    assert ":city" in reasons('(:type :REQUEST :target :tool :action :call :tool "weather" '
                              ':args (:days 3))', tools)
    assert ":days" in reasons('(:type :REQUEST :target :tool :action :call :tool "weather" '
                              ':args (:city "Oslo" :days "many"))', tools)
    assert "no tools are registered" in reasons(
        '(:type :REQUEST :target :tool :action :call :tool "weather")', None)


@pytest.mark.parametrize("channel, model", [("emacs", EmacsInsert), ("telegram", ChatIdMessage),
                                            ("signal", ChatIdMessage), ("matrix", MatrixMessage),
                                            ("cli", CliPrint)])
def test_reply_action_per_channel_is_valid(channel, model):
    made = reply_action(channel, "chat-1", "hello")
    assert type(made) is model
    assert validate_action(made.to_plist()) == made


# ------------------------------------------------- tool calls without arguments


@pytest.mark.parametrize("args", ["", " :args ()", " :args nil", " :args NIL"])
def test_a_tool_call_without_arguments_is_accepted_and_prints(args):
    call = action(f'(:type :REQUEST :target :tool :action :call :tool "clock"{args})',
                  default_tools())
    assert isinstance(call, ToolCall) and call.args == {}
    assert call.printed() == '(:type :request :target :tool :action :call :tool "clock")'
    assert action(call.printed(), default_tools()) == call


def test_tool_arguments_must_be_a_plist():
    assert ":args must be a plist of arguments" in reasons(
        '(:type :REQUEST :target :tool :action :call :tool "clock" :args (1 2))',
        default_tools())


def test_tool_signature_shows_each_argument_with_a_placeholder():
    tool = weather_tools().get("weather")
    assert tool.signature() == ('(:type :REQUEST :target :tool :action :call :tool "weather" '
                                ':args (:city <string> :days <integer, optional>))')


# ---------------------------------------------------- reasons in plain words

PYDANTIC_WORDS = ("Input should", "valid dictionary", "Value error", "function-before",
                  "list[", "str]", "Extra inputs", "Field required", "_plain_text")


@pytest.mark.parametrize("text, expected", [
    ('(:type :REQUEST :target :shell :cmd (1 2))',
     ":cmd must be a string or a list of strings in double quotes; item 1 is 1"),
    ('(:type :REQUEST :target :shell :cmd ())', ":cmd must be a string or a non-empty list"),
    ('(:type :REQUEST :target :shell :cmd :ls)', ":cmd must be a string"),
    ('(:type :REQUEST :target :cli :text 42)', ":text must be a string in double quotes, not 42"),
    ('(:type :REQUEST :target :cli :text hello)',
     ":text must be a string in double quotes, not hello"),
    ('(:type :REQUEST :target :telegram :chat-id "" :text "x")', ":chat-id must not be empty"),
    ('(:type :REQUEST :target :tool :action :call :tool "clock" :args 5)', ":args must be a plist"),
    ('(:type :REQUEST :target :emacs :action :eval :buffer "b" :text "x")',
     ":action must be :insert-at-end, not :eval"),
    ('(:type :REQUEST :target :emacs :action "insert-at-end" :buffer "b" :text "x")',
     ':action must be a keyword (:name), not "insert-at-end"'),
    ('(:type :LOG :text "x" :level :loud)',
     ":level must be one of :debug, :info, :warning or :error, not :loud"),
    ('(:type :REQUEST :target :cli :text "x" :color "red")', ":color is not a field of this action"),
])
def test_reasons_name_the_field_and_what_is_expected(text, expected):
    found = reasons(text, default_tools())
    assert expected in found
    assert not any(word in found for word in PYDANTIC_WORDS), found


def test_tool_argument_reasons_are_plain():
    found = reasons('(:type :REQUEST :target :tool :action :call :tool "weather" '
                    ':args (:days "many" :wind t))', weather_tools())
    assert ":city is missing" in found
    assert ':days must be a whole number, not "many"' in found
    assert ":wind is not an argument of tool 'weather'" in found
    assert not any(word in found for word in PYDANTIC_WORDS), found


def test_ten_thousand_bad_items_give_a_few_short_reasons():
    tools = ToolRegistry([Tool("sum", "Adds.", Numbers, lambda a: "")])
    items = " ".join(f'"{i}x"' for i in range(9_000))
    with pytest.raises(ActionRejected) as caught:
        action(f'(:type :REQUEST :target :tool :action :call :tool "sum" :args (:values ({items})))',
               tools)
    text = str(caught.value)
    assert len(text) < 1500 and "more problems" in text
    assert ':values item 1 must be a whole number, not "0x"' in text


class Numbers(BaseModel):
    values: list[int]


def test_huge_values_are_quoted_as_short_excerpts():
    long = "y" * 100_000
    found = reasons(f'(:type :REQUEST :target :emacs :action :insert-at-end :buffer "b" '
                    f':text "x" :{long} 1)')
    assert len(found) < 400
    found = reasons(f'(:type :{long} :text "x")')
    assert len(found) < 400


def test_lone_surrogates_in_text_are_rejected():
    form = {"type": Keyword("response"), "text": "caf\udce9"}
    with pytest.raises(ActionRejected) as caught:
        validate_action(form)
    assert "undecodable byte" in str(caught.value)


names = st.text(min_size=1, max_size=40).filter(lambda s: not SURROGATES.search(s))


@settings(max_examples=300, deadline=None)
@given(channel=st.sampled_from(["emacs", "telegram", "signal", "matrix", "cli", "wire"]),
       chat_id=names, buffer=names,
       text=st.text(max_size=200) | st.just("a lone \ud800 surrogate"))
def test_a_printed_reply_is_exactly_the_reply_actions_print(channel, chat_id, buffer, text):
    """The echo backend's fast path: the head printed once per address, then the text."""
    try:
        expected = reply_action(channel, chat_id, text, buffer).printed()
    except ValueError as error:                   # a lone surrogate: refused both ways
        with pytest.raises(ValueError):
            printed_reply(channel, chat_id, text, buffer)
        assert "surrogate" in str(error)
        return
    assert printed_reply(channel, chat_id, text, buffer) == expected
    assert _reply_head(channel, chat_id, buffer) is not None      # the fast path was taken
    assert read_plist(expected)["text"] == text
