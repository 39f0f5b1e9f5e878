"""json_schema_gbnf: the GBNF grammar allows exactly what xgrammar's schema grammar allows.

Each schema's corpus (valid JSON written compactly and with whitespace between tokens,
too much whitespace, whitespace around the value, wrong keys, wrong constants, bad
escapes, missing or reordered properties...) is run through two matchers:

- xgrammar's own grammar of the schema (what the local engine uses), the reference;
- our GBNF, compiled by xgrammar (``Grammar.from_ebnf``).

The two must agree on every string. That llama-server parses every one of these
grammars and generates under them is tests/integration/test_json_gbnf_llama_server.py.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

xgrammar = pytest.importorskip("xgrammar", reason="the reference grammars come from xgrammar")

from speculative_llm.errors import ConfigError  # noqa: E402
from speculative_llm.json_gbnf import JSON_WHITESPACE, _as_gbnf, json_schema_gbnf  # noqa: E402

WHITESPACE = 2
"""The local engine's JSON_WHITESPACE, written out: a change to it must be seen here."""


# ---- matchers --------------------------------------------------------------------------


class XgrammarMatcher:
    """Whole-string acceptance by an xgrammar grammar (no vocabulary: strings only)."""

    def __init__(self, grammar: Any) -> None:
        compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), cache_enabled=False)
        self._matcher = xgrammar.GrammarMatcher(
            compiler.compile_grammar(grammar), terminate_without_stop_token=True
        )

    def accepts(self, text: str) -> bool:
        self._matcher.reset()
        return bool(self._matcher.accept_string(text)) and bool(self._matcher.is_terminated())


def reference_matcher(schema: Mapping[str, Any], whitespace: int = WHITESPACE) -> XgrammarMatcher:
    """The local engine's grammar of ``schema``."""
    return XgrammarMatcher(
        xgrammar.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=True, max_whitespace_cnt=whitespace
        )
    )


def token_gaps(text: str) -> list[int]:
    """Positions between two JSON tokens of a compact JSON text (not its ends)."""
    gaps: set[int] = set()
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                gaps.add(index + 1)
        elif char == '"':
            in_string = True
            gaps.add(index)
        elif char in "{}[],:":
            gaps.update((index, index + 1))
    return sorted(gaps - {0, len(text)})


def whitespace_variants(text: str) -> Iterator[str]:
    """``text`` with whitespace between its tokens: allowed amounts, too much, at its ends."""
    gaps = token_gaps(text)
    for gap in gaps:
        for spaces in (" ", "\n", "\t\r", " \n", "\n  ", "   "):
            yield text[:gap] + spaces + text[gap:]
    for spaces in ("\n ", "\t", "\r\n\t"):
        spread = text
        for gap in reversed(gaps):
            spread = spread[:gap] + spaces + spread[gap:]
        yield spread
    yield from (" " + text, text + " ", text + "\n", "\n" + text)


def dumps(value: Any) -> str:
    """Compact JSON as xgrammar writes constants: non-ASCII kept, DEL escaped."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("\x7f", "\\u007f")


WEATHER_TOOLS: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "tool": {"const": "get_weather"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["city", "unit"],
                },
            },
            "required": ["tool", "arguments"],
        },
        {
            "type": "object",
            "properties": {
                "tool": {"const": "search"},
                "arguments": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["query"],
                },
            },
            "required": ["tool", "arguments"],
        },
        {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    ]
}


class Unit(enum.StrEnum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str = Field(description="City name")
    country: str | None = None


class WeatherCall(BaseModel):
    tool: Literal["get_weather"]
    mode: Literal["now", "forecast"]
    place: Place
    unit: Unit = Unit.CELSIUS
    days: list[int] = Field(default_factory=list, max_length=3)


# (schema, valid JSON values written compactly, strings to test as they are)
CASES: dict[str, tuple[dict[str, Any], list[Any], list[str]]] = {
    "tool-calls": (
        WEATHER_TOOLS,
        [
            {"tool": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
            {"tool": "search", "arguments": {"query": 'a "quoted" \\ path/é 😀'}},
            {"tool": "search", "arguments": {"query": "", "limit": -12}},
            {"answer": "It is 20\u00b0C.\nBye"},
        ],
        [
            '{"tool":"get_weather","arguments":{"city":"Paris"}}',  # missing required
            '{"tool":"get_weather","arguments":{"unit":"celsius","city":"Paris"}}',  # order
            '{"arguments":{"city":"Paris","unit":"celsius"},"tool":"get_weather"}',
            '{"tool":"get_wether","arguments":{"city":"Paris","unit":"celsius"}}',  # const
            '{"tool":"get_weather","arguments":{"city":"Paris","unit":"kelvin"}}',  # enum
            '{"tool":"get_weather","arguments":{"town":"Paris","unit":"celsius"}}',  # key
            '{"tool":"get_weather","arguments":{"city":"Pa\\xris","unit":"celsius"}}',
            '{"tool":"get_weather","arguments":{"city":"Pa\\u12","unit":"celsius"}}',
            '{"tool":"get_weather","arguments":{"city":"Pa\\u00E9","unit":"celsius"}}',
            '{"tool":"get_weather","arguments":{"city":"Pa\\/ris","unit":"celsius"}}',
            '{"tool":"get_weather","arguments":{"city":"Pa\tris","unit":"celsius"}}',
            '{"tool":"get_weather","arguments":{"city":"Pa\x7fris","unit":"celsius"}}',
            '{"tool":"search","arguments":{"query":"x","limit":1.5}}',
            '{"tool":"search","arguments":{"query":"x","limit":-0}}',
            '{"tool":"search","arguments":{"query":"x","limit":007}}',
            '{"tool":"search","arguments":{"query":"x","extra":1}}',
            '{"tool":"search","arguments":{"query":"x"},"answer":"y"}',
            '{"answer":"x",}',
            '{"answer":"x"}{}',
            '{"answer":null}',
            "{}",
            "",
        ],
    ),
    "integer-and-number": (
        {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "ratio": {"type": "number"}},
            "required": ["count", "ratio"],
            "additionalProperties": False,
        },
        [{"count": 0, "ratio": -0.5}, {"count": 12345, "ratio": 1e-7}, {"count": -3, "ratio": 2}],
        [
            '{"count":1,"ratio":-0}',
            '{"count":1,"ratio":1.}',
            '{"count":1,"ratio":.5}',
            '{"count":1,"ratio":1e}',
            '{"count":1,"ratio":1E+09}',
            '{"count":1,"ratio":1e-0}',
            '{"count":1,"ratio":01}',
            '{"count":1,"ratio":+1}',
            '{"count":1,"ratio":1 2}',
            '{"count":1.0,"ratio":1}',
            '{"count":1e3,"ratio":1}',
            '{"count":-0,"ratio":1}',
            '{"count":"1","ratio":1}',
            '{"count":1}',
        ],
    ),
    "optional-properties": (
        {
            "type": "object",
            "properties": {
                "a": {"type": "boolean"},
                "b": {"type": "string"},
                "c": {"type": "null"},
                "d": {"type": ["integer", "null"]},
            },
            "required": ["b"],
        },
        [
            {"b": "x"},
            {"a": True, "b": "x"},
            {"b": "x", "d": None},
            {"a": False, "b": "", "c": None, "d": 7},
            {"b": "x", "c": None},
        ],
        [
            '{"a":true}',
            '{"a":true,"c":null}',
            '{"b":"x","a":true}',
            '{"b":"x","d":null,"c":null}',
            '{"b":"x",,"c":null}',
            '{"b":"x","c":null,}',
            '{,"b":"x"}',
            '{"b":"x","d":"7"}',
            '{"b":"x","b":"y"}',
            "{}",
        ],
    ),
    "all-optional": (
        {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}},
        [{}, {"x": 1}, {"y": 2}, {"x": 1, "y": 2}],
        ['{"y":2,"x":1}', '{"x":1,}', "{,}", '{"z":1}'],
    ),
    "arrays": (
        {
            "type": "object",
            "properties": {
                "tags": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": 3,
                },
                "matrix": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "integer"}},
                },
                "pair": {
                    "type": "array",
                    "items": {"type": "boolean"},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "any": {"type": "array"},
                "none": {"type": "array", "items": {"type": "integer"}, "maxItems": 0},
            },
            "required": ["tags"],
        },
        [
            {"tags": ["a"]},
            {"tags": ["a", "b", "c"], "matrix": [[], [1, 2], [3]]},
            {"tags": ["a", "b"], "pair": [True, False]},
            {"tags": ["a"], "any": [1, "x", None, {"k": [True]}, []], "none": []},
        ],
        [
            '{"tags":[]}',
            '{"tags":["a","b","c","d"]}',
            '{"tags":["a",]}',
            '{"tags":["a"],"pair":[true]}',
            '{"tags":["a"],"pair":[true,false,true]}',
            '{"tags":["a"],"none":[1]}',
            '{"tags":["a"],"matrix":[[1,2.5]]}',
            '{"tags":["a"],"any":[1,]}',
            '{"tags":"a"}',
        ],
    ),
    "defs-and-refs": (
        {
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "name": {"$ref": "#/$defs/Name"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    },
                    "required": ["name"],
                },
                "Name": {"type": "string", "enum": ["x", "y", "z"]},
            },
            "$ref": "#/$defs/Node",
        },
        [
            {"name": "x"},
            {"name": "y", "children": []},
            {"name": "z", "children": [{"name": "x", "children": [{"name": "y"}]}, {"name": "z"}]},
        ],
        ['{"name":"w"}', '{"name":"x","children":[{"name":"q"}]}', '{"children":[]}'],
    ),
    "pydantic": (
        WeatherCall.model_json_schema(),
        [
            {"tool": "get_weather", "mode": "now", "place": {"city": "Oslo"}},
            {
                "tool": "get_weather",
                "mode": "forecast",
                "place": {"city": "Oslo", "country": None},
                "unit": "fahrenheit",
                "days": [1, 2, 3],
            },
            {"tool": "get_weather", "mode": "now", "place": {"city": "O", "country": "NO"}},
        ],
        [
            '{"tool":"get_weather","mode":"later","place":{"city":"Oslo"}}',
            '{"tool":"get_weather","mode":"now","place":{"country":"NO"}}',
            '{"tool":"get_weather","mode":"now","place":{"city":"Oslo"},"unit":"kelvin"}',
            '{"tool":"get_weather","mode":"now","place":{"city":"Oslo"},"days":[1,2,3,4]}',
            '{"mode":"now","tool":"get_weather","place":{"city":"Oslo"}}',
        ],
    ),
    "no-types": (
        {
            "properties": {
                "a": {"items": {"type": "integer"}, "maxItems": 2},
                "b": {"properties": {"c": {"enum": [1, 2]}}, "additionalProperties": False},
                "d": {"title": "anything", "description": "no keyword but annotations"},
            },
            "required": ["a"],
        },
        [{"a": []}, {"a": [1, -2], "b": {"c": 2}, "d": [{}]}, {"a": [0], "b": {}, "d": "x"}],
        ['{"a":[1,2,3]}', '{"a":[],"b":{"c":3}}', '{"a":[],"b":{"e":1}}', '{"b":{}}'],
    ),
    "any-json-and-constants": (
        {
            "type": "object",
            "properties": {
                "anything": {},
                "also": True,
                "bare": {"type": "object"},
                "map": {"type": "object", "additionalProperties": {"type": "integer"}},
                "empty": {"type": "object", "additionalProperties": False},
                "const": {"const": {"k": ['é\n"\\/\x01\x7f😀', 1, None, True]}},
                "choice": {"enum": ["a", 2, None, False, [1], {"b": "c"}]},
                "text-or-null": {"type": ["string", "null"], "description": "ignored"},
                "either": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
                "one": {"allOf": [{"type": "string"}]},
            },
            "required": ["anything"],
        },
        [
            {"anything": {"a": [1, 2.5e3, "x", None, True, {}]}},
            {"anything": 3, "also": "x", "bare": {"k": {"n": []}}, "map": {"a": 1, "b": -2}},
            {
                "anything": [],
                "map": {},
                "empty": {},
                "const": {"k": ['é\n"\\/\x01\x7f😀', 1, None, True]},
            },
            {"anything": None, "choice": {"b": "c"}, "text-or-null": None, "either": False},
            {"anything": "", "choice": 2, "text-or-null": "t", "either": 5, "one": "s"},
        ],
        [
            '{"anything":1,"map":{"a":"x"}}',
            '{"anything":1,"empty":{"a":1}}',
            '{"anything":1,"const":{"k":["é\\n\\"\\\\/\\u0001\x7f😀",1,null,true]}}',
            '{"anything":1,"const":{"k":["é\\n\\"\\\\\\/\\u0001\\u007f😀",1,null,true]}}',
            '{"anything":1,"choice":{"b":"d"}}',
            '{"anything":1,"choice":2.0}',
            '{"anything":1,"either":"x"}',
            '{"anything":01}',
            '{"anything":[1,]}',
        ],
    ),
    # Constructs the hand-written converter refused and xgrammar's grammar covers.
    "bounds-lengths-formats": (
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 3, "maximum": 120},
                "s": {"type": "string", "minLength": 1, "maxLength": 3},
                "d": {"type": "string", "format": "date"},
                "p": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
                "k": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
                "f": {"const": 1.5},
                "free": {"not": {"type": "integer"}},
            },
            "required": ["n"],
        },
        [
            {"n": 3},
            {"n": 120, "s": "abc", "d": "2026-12-05"},
            {"n": 50, "p": [1, "a"], "k": [1, 2, 3], "f": 1.5, "free": 7},
        ],
        [
            '{"n":2}',
            '{"n":121}',
            '{"n":5,"s":""}',
            '{"n":5,"s":"abcd"}',
            '{"n":5,"d":"2026-13-01"}',
            '{"n":5,"d":"26-01-01"}',
            '{"n":5,"p":["a",1]}',
            '{"n":5,"k":[1]}',
            '{"n":5,"f":1.50}',
            '{"s":"a"}',
        ],
    ),
    "named-and-additional-properties": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": {"type": "string"},
        },
        [{"a": 1}, {"a": 1, "b": "x", "c": "y"}],
        ['{"a":1,"b":2}', '{"b":"x"}', '{"a":"1"}', '{"a":1,"b":"x",}', '{"a":1,"b"}', "{}"],
    ),
    "escapes-in-constants-and-classes": (
        {
            "type": "object",
            "properties": {
                "c": {"const": "\x00\x07\x08\x0b\x0c\x1b'?é\u00e9a 😀\t"},
                "e": {"enum": ["a-b", "x]y", "^z", "[q", "back\\slash"]},
            },
            "required": ["c", "e"],
        },
        [
            {"c": "\x00\x07\x08\x0b\x0c\x1b'?é\u00e9a 😀\t", "e": "a-b"},
            {"c": "\x00\x07\x08\x0b\x0c\x1b'?é\u00e9a 😀\t", "e": "^z"},
            {"c": "\x00\x07\x08\x0b\x0c\x1b'?é\u00e9a 😀\t", "e": "back\\slash"},
        ],
        [
            '{"c":"","e":"a-b"}',
            '{"c":"\\u0000\\u0007\\b\\u000b\\f\\u001b\'?éea 😀\\t","e":"x]y"}',
            '{"c":"\\u0000\\u0007\\b\\u000b\\f\\u001b\'?éé 😀\\t","e":"x]y"}',
            '{"c":"\\u0000\\u0007\\b\\u000b\\f\\u001b\'?ééa 😀\\t","e":"a"}',
            '{"c":"\\u0000\\u0007\\b\\u000b\\f\\u001b\'?ééa 😀\\t","e":"[q]"}',
            '{"c":"\\u0000\\u0007\\b\\u000b\\f\\u001b\'?ééa 😀\\t","e":"a_b"}',
        ],
    ),
}


def case(name: str) -> tuple[dict[str, Any], list[str]]:
    """A case's schema and its corpus (every string in it, valid or not)."""
    schema, values, strings = CASES[name]
    compact = [dumps(value) for value in values]
    corpus = list(
        dict.fromkeys([*compact, *strings, *(v for c in compact for v in whitespace_variants(c))])
    )
    return schema, corpus


def reference_results(schema: Mapping[str, Any], corpus: list[str]) -> dict[str, bool]:
    reference = reference_matcher(schema)
    results = {text: reference.accepts(text) for text in corpus}
    # The corpus must say something: the valid values written compactly pass, and many
    # of the other strings fail.
    assert sum(results.values()) > 0 and sum(not ok for ok in results.values()) > 5
    return results


# ---- the tests -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_same_language_as_xgrammar_schema_grammar(name: str) -> None:
    schema, corpus = case(name)
    expected = reference_results(schema, corpus)
    for value in CASES[name][1]:
        assert expected[dumps(value)], f"the reference rejects a valid value: {dumps(value)}"
    ours = XgrammarMatcher(xgrammar.Grammar.from_ebnf(json_schema_gbnf(schema)))
    differences = {text: ok for text, ok in expected.items() if ours.accepts(text) != ok}
    assert not differences, (
        f"xgrammar accepts these, and our grammar does not (or not these): {differences}"
    )


@pytest.mark.parametrize("whitespace", [1, 3])
def test_other_whitespace_limits(whitespace: int) -> None:
    schema, corpus = case("tool-calls")
    reference = reference_matcher(schema, whitespace)
    ours = XgrammarMatcher(
        xgrammar.Grammar.from_ebnf(json_schema_gbnf(schema, max_whitespace=whitespace))
    )
    for text in corpus:
        assert ours.accepts(text) == reference.accepts(text), text


def test_grammar_is_ascii_with_gbnf_rule_names() -> None:
    grammar = json_schema_gbnf(WeatherCall.model_json_schema() | {"title": "Weather call, é"})
    assert grammar.isascii()
    names = [line.split(" ::= ")[0] for line in grammar.splitlines()]
    assert names[0] == "root"
    assert all(re.fullmatch(r"[a-zA-Z0-9-]+", name) for name in names)
    assert len(names) == len(set(names))
    # xgrammar's own notation, which llama-server refuses, is gone; so is \x, which the
    # two parsers read differently (llama.cpp two hex digits, xgrammar all that follow).
    assert "(=" not in grammar and ", -1}" not in grammar and "\\0" not in grammar
    assert "\\x" not in grammar


def test_xgrammar_dialect_is_rewritten_as_gbnf() -> None:
    """What llama-server refuses or reads otherwise in xgrammar's printed grammar, rewritten."""
    ebnf = "\n".join(
        [
            r'root ::= ((basic_item{0, -1} "\0\e\'\?\xe9a\U0001f600" [^\0-\x1f\-a-z\]]{1, 3}))'
            r" (=(whitespace_2{0, 2} [,}\]:]))",
            r'basic_item ::= (("x") | (""))',
            "",
        ]
    )
    assert _as_gbnf(ebnf).splitlines() == [
        r'root ::= ((basic-item{0,} "\u0000\u001B'
        r"'?\u00E9a\U0001F600"
        r'" [^\u0000-\u001F\-a-z\]]{1,3}))',
        r'basic-item ::= (("x") | (""))',
    ]


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        # What GBNF cannot say: a regular expression, a repeat llama.cpp refuses, a rule
        # that reaches itself before any character (xgrammar allows all three).
        ({"type": "string", "pattern": "^a+$"}, "pattern"),
        ({"type": "array", "items": {}, "maxItems": 5000}, "over 1000"),
        ({"type": "string", "minLength": 5000}, "over 1000"),
        ({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, "left recursion"),
        (
            {"$ref": "#/$defs/A", "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {}]}}},
            "left recursion",
        ),
        # What xgrammar refuses, with its reason.
        ({"type": "array", "minItems": 1}, "minItems"),
        ({"$ref": "#/$defs/Missing"}, "#/$defs/Missing"),
        (
            {
                "$ref": "#/$defs/A",
                "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
            },
            "Circular $ref",
        ),
        ({"enum": []}, "enum"),
        ({"type": "date"}, "date"),
        ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "false"),
    ],
)
def test_unsupported_constructs_are_config_errors(schema: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        json_schema_gbnf(schema)
    assert raised.value.field == "response_format"
    assert named in str(raised.value)


@pytest.mark.parametrize("whitespace", [0, -1, 1001, True, 2.0])
def test_bad_whitespace_limit_is_a_config_error(whitespace: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        json_schema_gbnf({"type": "integer"}, max_whitespace=whitespace)
    assert raised.value.field == "response_format"


def test_default_whitespace_is_the_local_engines() -> None:
    assert JSON_WHITESPACE == WHITESPACE
    assert json_schema_gbnf({"type": "integer"}) == json_schema_gbnf(
        {"type": "integer"}, max_whitespace=WHITESPACE
    )
    pytest.importorskip("torch", reason="the local engine's grammar module imports torch")
    from speculative_llm.engine.request.grammar import JSON_WHITESPACE as ENGINE_WHITESPACE

    assert JSON_WHITESPACE == ENGINE_WHITESPACE
