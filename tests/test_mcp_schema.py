"""An MCP tool's schema and listing, without a server: plist keys and values mapped to
the schema, short errors, bounded cost on hostile schemas and arguments, and the
Tool built from a listing (name, description, risk); `[mcp]` settings."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from opencortex.plist_syntax import Keyword, Symbol
from opencortex.tools.mcp_schema import MAX_SCHEMA_CHARS, ArgumentChecker, SchemaRefused
from opencortex.tools.mcp_settings import McpServerSettings, McpSettings
from opencortex.tools.mcp_tools import build_tool, result_text, risk_of

SEARCH = {"type": "object", "required": ["query"],
          "properties": {"query": {"type": "string"},
                         "max_results": {"type": "integer", "minimum": 1},
                         "pageSize": {"type": "integer"},
                         "exact": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "sort": {"enum": ["new", "old"]}}}


def bounded(function, seconds: float = 20.0):
    """FUNCTION's result, failing (not hanging) when it runs longer than SECONDS."""
    box: dict = {}

    def work():
        try:
            box["value"] = function()
        except Exception as error:
            box["error"] = error

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "took unbounded time"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_plist_keys_and_values_become_the_schemas_json():
    checker = ArgumentChecker(SEARCH)
    args = {"query": "org", "max-results": 5, "pagesize": 2, "exact": None,
            "tags": [Symbol("a"), "b"], "sort": Keyword("new")}
    assert checker.check(args) == {"query": "org", "max_results": 5, "pageSize": 2,
                                   "exact": False, "tags": ["a", "b"], "sort": "new"}
    assert type(checker.check({"query": Keyword("x")})["query"]) is str


def test_errors_are_short_and_name_the_plist_keys():
    checker = ArgumentChecker(SEARCH)
    cases = {
        "missing :query": {},
        ":max-results must be an integer, not \"5\"": {"query": "x", "max-results": "5"},
        ":max-results: 0 is less than the minimum of 1": {"query": "x", "max_results": 0},
        ":tags item 1 must be a string, not 7": {"query": "x", "tags": ["a", 7]},
        ':sort must be one of "new", "old", not "mid"': {"query": "x", "sort": "mid"},
    }
    for expected, args in cases.items():
        with pytest.raises(ValueError) as error:
            checker.check(args)
        assert str(error.value) == expected
    with pytest.raises(ValueError, match=r"^:colour is not an argument of this tool "
                                         r"\(its arguments: :query :max-results"):
        checker.check({"query": "x", "colour": 1})
    with pytest.raises(ValueError, match="repeats the argument :max-results"):
        checker.check({"query": "x", "max-results": 1, "max_results": 2})
    with pytest.raises(ValueError, match="finite"):
        checker.check({"query": "x", "pageSize": float("inf")})


def test_keys_are_open_only_where_the_schema_says_so():
    assert ArgumentChecker({"type": "object"}).check({"any": 1}) == {"any": 1}
    open_schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    assert ArgumentChecker(open_schema).check({"b": 2}) == {"b": 2}
    with pytest.raises(ValueError, match="its arguments: none"):
        ArgumentChecker({"type": "object", "properties": {}}).check({"b": 2})
    ambiguous = {"type": "object", "properties": {"a_b": {}, "ab": {}}}
    assert ArgumentChecker(ambiguous).check({"a-b": 1, "ab": 2}) == {"a_b": 1, "ab": 2}
    with pytest.raises(ValueError, match=":a--b is not an argument"):
        ArgumentChecker(ambiguous).check({"a--b": 1})


def test_hostile_schemas_cost_bounded_time():
    backtracking = {"type": "object", "properties": {"s": {"type": "string",
                                                           "pattern": "^(a+)+$"}}}
    assert bounded(lambda: ArgumentChecker(backtracking).check({"s": "a" * 40 + "!"})) \
        == {"s": "a" * 40 + "!"}    # patterns are the server's to check
    doubling = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                "$defs": {"a": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/a"}},
                                          {"type": "array", "items": {"$ref": "#/$defs/a"}},
                                          {"type": "integer"}]}}}
    nested: list = ["leaf"]
    for _ in range(40):
        nested = [nested]
    with pytest.raises(ValueError, match="too complex to check|nests too deeply"):
        bounded(lambda: ArgumentChecker(doubling).check({"x": nested}))
    remote = {"type": "object", "properties": {"x": {"$ref": "https://example.invalid/s"}}}
    with pytest.raises(ValueError, match="cannot be checked against the tool's schema"):
        bounded(lambda: ArgumentChecker(remote).check({"x": 1}))
    many = {"type": "object", "properties": {"u": {"type": "array", "uniqueItems": True}}}
    assert bounded(lambda: ArgumentChecker(many).check({"u": [{"k": i} for i in range(5000)]}))


def test_unusable_schemas_are_refused():
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"}
                                             for i in range(MAX_SCHEMA_CHARS // 20)}}
    refused = [huge, [], {"type": "string"}, {"type": "object", "properties": {"a b": {}}},
               {"type": "object", "properties": {"a": {"type": "no-such-type"}}}]
    for schema in refused:
        with pytest.raises(SchemaRefused):
            ArgumentChecker(schema)
    with pytest.raises(ValueError, match="characters as JSON"):
        ArgumentChecker({"type": "object"}).check({"text": "x" * 600_000})


def listing(name="search", description="Search notes.", annotations=None, schema=SEARCH):
    return SimpleNamespace(name=name, title=None, description=description,
                           annotations=annotations, input_schema=schema)


def test_a_listing_becomes_a_tool_with_a_visible_description_and_a_risk():
    async def call(tool, args):
        return "unused"

    tool = build_tool("notes", listing(description="Find.\n* Heading\x1b[2J [[link]]"),
                      "untrusted", call)
    assert tool.name == "notes/search" and tool.trust == "untrusted"
    assert tool.description == "Find. * Heading␛[2J [ [link] ]"
    assert tool.risk == "writes"
    assert tool.signature().endswith(
        ':args (:query <string> :max-results <integer, optional> :pageSize <integer, '
        'optional> :exact <t-or-nil, optional> :tags <list, optional> :sort <"new"|"old", '
        'optional>))')
    assert build_tool("n", listing(description=""), "trusted", call).description == \
        "Tool search of MCP server n."
    for bad in ("a b", "x" * 129, "(evil)", ""):
        with pytest.raises(ValueError):
            build_tool("n", listing(name=bad), "trusted", call)
    hints = SimpleNamespace
    assert risk_of(hints(read_only_hint=True, open_world_hint=True)) == "read-only"
    assert risk_of(hints(read_only_hint=False, open_world_hint=True)) == "external"
    assert risk_of(hints(read_only_hint=None, open_world_hint=None)) == "writes"
    assert risk_of(None) == "writes"


def test_results_are_joined_summarised_and_capped():
    text = SimpleNamespace(type="text", text="line\x1b[31m")
    audio = SimpleNamespace(type="audio", data="A" * 4096)
    blob = SimpleNamespace(type="resource", resource=SimpleNamespace(uri="file:///x", blob="AAAA"))
    result = SimpleNamespace(content=[text, audio, blob], structured_content=None)
    assert result_text(result, 1000) == "line␛[31m\n[audio, 3 KB]\n[resource file:///x, 3 bytes]"
    structured = SimpleNamespace(content=[], structured_content={"n": 1})
    assert result_text(structured, 100) == '{"n": 1}'
    long = SimpleNamespace(content=[SimpleNamespace(type="text", text="y" * 10**6)] * 50,
                           structured_content=None)
    cut = result_text(long, 200)
    assert len(cut) <= 200 and cut.endswith("[result cut to 200 characters]")


def test_settings_check_names_entries_and_keep_the_environment_listed():
    settings = McpServerSettings(command=["srv"], env=["PATH", "KEY", "FIXED=a=b"])
    assert settings.trust == "untrusted"
    assert settings.environment({"PATH": "/bin", "OTHER": "x"}) == {"PATH": "/bin",
                                                                   "FIXED": "a=b"}
    assert McpServerSettings(command=["srv"]).env == ["PATH", "HOME", "LANG"]
    bad = [{"servers": {"a b": {"command": ["x"]}}},
           {"servers": {"a": {"command": []}}},
           {"servers": {"a": {"command": ["x"], "env": ["1BAD"]}}},
           {"servers": {"a": {"command": ["x"], "trust": "kernel"}}},
           {"servers": {"a": {"command": ["x"], "shell": True}}}]
    for data in bad:
        with pytest.raises(ValidationError):
            McpSettings.model_validate(data)
