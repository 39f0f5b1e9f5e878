r"""JSON schemas as GBNF grammars for llama-server, in the language the local engine uses.

The local engine constrains a schema with the grammar xgrammar compiles for it
(``Grammar.from_json_schema(schema, any_whitespace=True, max_whitespace_cnt=2)``).
llama-server converts a ``json_schema`` with its own converter, which allows other
whitespace (``" " | "\n"{1,2} [ \t]{0,20}``) between tokens: a small model then writes
different JSON on the two sides and they do different work. ``json_schema_gbnf`` writes a
GBNF grammar (the ``grammar`` field of llama-server's ``/completion`` and
``/v1/chat/completions``) that allows exactly the strings xgrammar's grammar allows, so
both sides are constrained identically:

- up to ``max_whitespace`` characters of ``[ \n\r\t]`` between JSON tokens, none before
  or after the whole value;
- object properties in the schema's order, the required ones present, the others
  optional, no other keys (xgrammar's strict mode);
- strings of any character but ``"``, ``\`` and controls, or the JSON escapes;
  integers ``0 | -?[1-9][0-9]*`` (no ``-0``), numbers ``-?(0|[1-9][0-9]*)(.[0-9]+)?
  ([eE][+-]?[0-9]+)?``;
- ``const`` and ``enum`` values as their compact JSON text.

Constructs whose handling by xgrammar is not mirrored here (string ``pattern`` /
``format`` / lengths, numeric bounds, ``prefixItems``, additional properties next to
named ones, ``allOf`` of several schemas...) raise ``ConfigError`` instead of producing a
grammar of another language.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from speculative_llm.errors import ConfigError

__all__ = ["JSON_WHITESPACE", "json_schema_gbnf"]

JSON_WHITESPACE = 2
"""Most whitespace characters between two JSON tokens in the local engine's schema grammars
(``backends.local.grammar`` compiles them with it) and in the GBNF written here."""

_FIELD = "response_format"

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$defs",
        "definitions",
    }
)
"""Keywords that say nothing about which values are valid (xgrammar ignores them too)."""

_TYPE_KEYWORDS: Mapping[str, frozenset[str]] = {
    "string": frozenset(),
    "integer": frozenset(),
    "number": frozenset(),
    "boolean": frozenset(),
    "null": frozenset(),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    # xgrammar does not enforce uniqueItems either: ignoring it keeps the same language.
    "array": frozenset({"items", "minItems", "maxItems", "uniqueItems"}),
}
"""The keywords each type supports besides ``type`` and the annotations."""

_TYPED_KEYWORDS = frozenset().union(*_TYPE_KEYWORDS.values())

_MOST_REPEATS = 1000
"""Largest minItems/maxItems/max_whitespace: llama.cpp refuses to repeat an item 2000
times or more, and reads a larger upper bound as none."""

_JSON_INT_LIMIT = 2**63
"""xgrammar writes integers outside int64 in exponent notation, so const/enum avoid them."""

_PRIMITIVES: Mapping[str, str] = {
    "string": r'"\"" char* "\""',
    "char": r'[^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "integer": r'"0" | "-"? [1-9] [0-9]*',
    "number": r'"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?',
    "boolean": r'"true" | "false"',
    "null": r'"null"',
    "value": "object | array | string | number | boolean | null",
    "object": r'"{" ws "}" | "{" ws member member-more* ws "}"',
    "member": r'string ws ":" ws value',
    "member-more": r'ws "," ws member',
    "array": r'"[" ws "]" | "[" ws value value-more* ws "]"',
    "value-more": r'ws "," ws value',
}
"""Rules of the JSON building blocks, in xgrammar's language (``ws`` is added apart)."""

_PRIMITIVE_DEPENDENCIES: Mapping[str, tuple[str, ...]] = {
    "string": ("char",),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("ws", "member", "member-more"),
    "member": ("ws", "string", "value"),
    "member-more": ("ws", "member"),
    "array": ("ws", "value", "value-more"),
    "value-more": ("ws", "value"),
}

_NOT_A_NAME = re.compile(r"[^a-zA-Z0-9]+")


def json_schema_gbnf(schema: Mapping[str, Any], *, max_whitespace: int = JSON_WHITESPACE) -> str:
    """A GBNF grammar whose language is xgrammar's grammar of ``schema``.

    The grammar allows exactly the strings that
    ``xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True,
    max_whitespace_cnt=max_whitespace)`` allows, so llama-server (given it as
    ``grammar``) and the local engine constrain a generation identically.

    Supported: ``type`` (one or a list of ``string``, ``integer``, ``number``,
    ``boolean``, ``null``, ``object``, ``array``) or no type (any JSON value, or an
    object / array when ``properties`` / ``items`` say so); ``properties`` with
    ``required`` (keys in the schema's order, no other keys); objects with no named
    properties and ``additionalProperties`` (``false``, ``true`` or a schema: a map);
    ``items`` with ``minItems`` / ``maxItems`` (``uniqueItems`` is ignored, as xgrammar
    does); ``const`` and ``enum`` of strings, integers, booleans, null, and arrays or
    objects of them; ``anyOf`` / ``oneOf``; ``allOf`` of one schema; local ``$ref``
    (``#/$defs/...``, ``#/definitions/...``, ``#``, recursion included); boolean
    schemas ``true``; annotations (``title``, ``description``, ``default``,
    ``examples``, ...) are ignored.

    Args:
        schema: The JSON schema, as a mapping.
        max_whitespace: Most whitespace characters between two JSON tokens (the local
            engine's, ``JSON_WHITESPACE``, by default); at least 1, as xgrammar requires.

    Returns:
        The grammar's text, with the start rule ``root``.

    Raises:
        ConfigError: ``field="response_format"``: the schema uses a construct outside
            that subset (the message names it and where it is), or is malformed.
    """
    if isinstance(max_whitespace, bool) or not isinstance(max_whitespace, int):
        raise ConfigError(
            f"max_whitespace must be an integer, not {max_whitespace!r}.", field=_FIELD
        )
    if not 1 <= max_whitespace <= _MOST_REPEATS:
        raise ConfigError(
            f"max_whitespace must be from 1 (xgrammar, whose language the grammar mirrors, "
            f"allows no less) to {_MOST_REPEATS}, not {max_whitespace}.",
            field=_FIELD,
        )
    if not isinstance(schema, Mapping):
        raise ConfigError(
            f"The JSON schema must be an object, not {type(schema).__name__}.", field=_FIELD
        )
    return _GbnfWriter(schema, max_whitespace).grammar()


def _unsupported(path: str, what: str, advice: str) -> ConfigError:
    return ConfigError(
        f"The JSON schema at {path} uses {what}, which json_schema_gbnf cannot turn into a "
        f"GBNF grammar allowing exactly what the local engine's grammar allows. {advice}",
        field=_FIELD,
    )


def _malformed(path: str, problem: str) -> ConfigError:
    return ConfigError(f"The JSON schema at {path} is malformed: {problem}.", field=_FIELD)


def _gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (llama.cpp's and xgrammar's escapes)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        elif code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            # Escaped so the grammar is ASCII, whatever carries it.
            out.append(f"\\u{code:04X}")
        else:
            out.append(f"\\U{code:08X}")
    out.append('"')
    return "".join(out)


def _check_json_value(value: Any, path: str) -> None:
    """Refuse a const/enum value whose JSON text xgrammar writes otherwise than we do."""
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and any(0xD800 <= ord(char) <= 0xDFFF for char in value):
            raise _unsupported(
                path, "a string with a lone surrogate", "Write the character as a valid pair."
            )
        return
    if isinstance(value, int):
        if not -_JSON_INT_LIMIT <= value < _JSON_INT_LIMIT:
            raise _unsupported(
                path,
                f"the integer {value} beyond 64 bits (xgrammar writes it in exponent notation)",
                "Use a smaller integer or a string.",
            )
        return
    if isinstance(value, float):
        raise _unsupported(
            path,
            f"the number {value!r} in const/enum (xgrammar writes numbers with a fraction "
            "or exponent in its own notation)",
            "Use integers or strings as constant values.",
        )
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}/{index}")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_json_value(key, path)
            _check_json_value(item, f"{path}/{key}")
        return
    raise _malformed(path, f"{value!r} is not a JSON value")


def _sequence(*parts: str) -> str:
    """The GBNF sequence of the non-empty ``parts``."""
    return " ".join(part for part in parts if part)


def _json_text(value: Any) -> str:
    """A value's compact JSON text, spelled as xgrammar spells it."""
    # xgrammar keeps non-ASCII characters and escapes DEL, which Python leaves raw; DEL
    # never appears escaped in Python's output, so replacing it is safe.
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("\x7f", "\\u007f")


class _GbnfWriter:
    """Writes the rules of one schema's grammar (see ``json_schema_gbnf``).

    Rules are added as the schema is walked: ``root`` first, then the rules of the
    subschemas that need one (objects, arrays, alternatives, ``$ref`` targets), then the
    JSON building blocks that were used.
    """

    def __init__(self, schema: Mapping[str, Any], max_whitespace: int) -> None:
        self._root = schema
        self._max_whitespace = max_whitespace
        self._rules: dict[str, str] = {}
        self._primitives: set[str] = set()
        self._ref_rules: dict[str, str] = {}
        # The $ref targets each finished $ref rule can start with, without consuming a
        # character first: a $ref back to one of them there would be left recursion,
        # which neither llama.cpp nor xgrammar accepts.
        self._leading_refs: dict[str, frozenset[str]] = {}

    def grammar(self) -> str:
        self._rules["root"] = ""
        self._ref_rules["#"] = "root"
        leading: set[str] = set()
        alternatives = self._alternatives(self._root, "#", "root", frozenset({"#"}), leading)
        self._rules["root"] = " | ".join(alternatives)
        self._leading_refs["#"] = frozenset(leading)
        lines = [f"{name} ::= {body}" for name, body in self._rules.items()]
        for name in sorted(self._primitives):
            body = (
                f"[ \\t\\n\\r]{{0,{self._max_whitespace}}}" if name == "ws" else _PRIMITIVES[name]
            )
            lines.append(f"{name} ::= {body}")
        return "\n".join(lines) + "\n"

    # Names and building blocks ---------------------------------------------------------

    def _use(self, name: str) -> str:
        """Name a building block (``string``, ``ws``, ``value``...) and add its rules."""
        if name not in self._primitives:
            self._primitives.add(name)
            for dependency in _PRIMITIVE_DEPENDENCIES.get(name, ()):
                self._use(dependency)
        return name

    def _new_rule(self, hint: str) -> str:
        """A fresh rule name made from ``hint`` (GBNF names: letters, digits, hyphens)."""
        # Every schema rule starts with "root" or "ref", so none is a building block's.
        base = _NOT_A_NAME.sub("-", hint).strip("-") or "rule"
        name, number = base, 1
        while name in self._rules:
            number += 1
            name = f"{base}-{number}"
        self._rules[name] = ""
        return name

    def _guarded(self, schema: Any, path: str, hint: str) -> str:
        """A GBNF expression for a subschema that comes after a consumed character.

        One sequence inline, or the name of a new rule holding the alternatives.
        """
        alternatives = self._alternatives(schema, path, hint, frozenset(), set())
        if len(alternatives) == 1:
            return alternatives[0]
        name = self._new_rule(hint)
        self._rules[name] = " | ".join(alternatives)
        return name

    # Schemas -----------------------------------------------------------------------

    def _alternatives(
        self, schema: Any, path: str, hint: str, unguarded: frozenset[str], leading: set[str]
    ) -> list[str]:
        """The GBNF alternatives (sequences) whose union is ``schema``'s language.

        Args:
            schema: The (sub)schema.
            path: Where it is, as a JSON pointer (for messages).
            hint: Base of the names of the rules it needs.
            unguarded: The ``$ref`` targets being written that this position starts, with
                nothing consumed since: a ``$ref`` to one of them is left recursion.
            leading: Collects the ``$ref`` targets this position can start with.
        """
        if schema is True:
            return [self._use("value")]
        if schema is False:
            raise _unsupported(
                path, "the schema false (no value is valid)", "Remove the property or branch."
            )
        if not isinstance(schema, Mapping):
            raise _malformed(path, f"a schema must be an object or a boolean, not {schema!r}")
        keys = set(schema)
        if "$ref" in keys:
            self._only(schema, path, "$ref", set())
            return [self._ref(schema["$ref"], path, unguarded, leading)]
        if "const" in keys or "enum" in keys:
            return self._constants(schema, path)
        for keyword in ("anyOf", "oneOf"):
            if keyword in keys:
                # discriminator: an OpenAPI hint for oneOf (pydantic writes it); no constraint.
                self._only(schema, path, keyword, {"discriminator"})
                branches = schema[keyword]
                if not isinstance(branches, list) or not branches:
                    raise _malformed(path, f"{keyword} must be a non-empty list of schemas")
                alternatives: list[str] = []
                for index, branch in enumerate(branches):
                    for alternative in self._alternatives(
                        branch, f"{path}/{keyword}/{index}", f"{hint}-{index}", unguarded, leading
                    ):
                        if alternative not in alternatives:
                            alternatives.append(alternative)
                return alternatives
        if "allOf" in keys:
            self._only(schema, path, "allOf", set())
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise _unsupported(
                    path,
                    "allOf with other than one schema (xgrammar does not intersect schemas)",
                    "Merge the schemas into one.",
                )
            return self._alternatives(parts[0], f"{path}/allOf/0", hint, unguarded, leading)
        return self._typed(schema, path, hint)

    def _only(self, schema: Mapping[str, Any], path: str, keyword: str, extra: set[str]) -> None:
        """Refuse keywords next to ``keyword`` that xgrammar would ignore or merge."""
        others = sorted(set(schema) - _ANNOTATIONS - extra - {keyword})
        if others:
            raise _unsupported(
                path,
                f"{', '.join(others)} next to {keyword}",
                f"Move the other keywords into the schemas that {keyword} names.",
            )

    def _ref(self, reference: Any, path: str, unguarded: frozenset[str], leading: set[str]) -> str:
        if not isinstance(reference, str):
            raise _malformed(path, "$ref must be a string")
        if reference != "#" and not reference.startswith("#/"):
            raise _unsupported(
                path,
                f"the $ref {reference!r} (only references inside the schema, such as "
                "#/$defs/Name, are supported)",
                "Put the referenced schema under $defs.",
            )
        if reference in self._ref_rules:
            starts = {reference} | self._leading_refs.get(reference, frozenset())
            if starts & unguarded:
                raise _unsupported(
                    path,
                    f"the $ref {reference!r}, which reaches itself without any JSON in between",
                    "Break the circle of references with an object or array.",
                )
            leading.update(starts)
            return self._ref_rules[reference]
        target = self._resolve(reference, path)
        last = reference.rsplit("/", 1)[-1]
        name = self._new_rule(f"ref-{last}")
        self._ref_rules[reference] = name
        own_leading: set[str] = set()
        alternatives = self._alternatives(
            target, reference, name, unguarded | {reference}, own_leading
        )
        self._rules[name] = " | ".join(alternatives)
        self._leading_refs[reference] = frozenset(own_leading)
        leading.update(own_leading | {reference})
        return name

    def _resolve(self, reference: str, path: str) -> Any:
        """The schema a local $ref (a JSON pointer after '#') points to."""
        node: Any = self._root
        for token in reference[2:].split("/") if reference != "#" else []:
            part = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise _malformed(path, f"$ref {reference!r} points to nothing")
        return node

    def _constants(self, schema: Mapping[str, Any], path: str) -> list[str]:
        # xgrammar lets const (then enum) decide and ignores type next to them.
        self._only(schema, path, "const" if "const" in schema else "enum", {"type", "enum"})
        if "const" in schema:
            values = [schema["const"]]
        else:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise _malformed(path, "enum must be a non-empty list")
        alternatives: list[str] = []
        for value in values:
            _check_json_value(value, path)
            literal = _gbnf_literal(_json_text(value))
            if literal not in alternatives:
                alternatives.append(literal)
        return alternatives

    def _typed(self, schema: Mapping[str, Any], path: str, hint: str) -> list[str]:
        """Alternatives of a schema described by ``type`` (or by its keywords)."""
        validation = set(schema) - _ANNOTATIONS
        unknown_keywords = sorted(validation - {"type"} - _TYPED_KEYWORDS)
        if unknown_keywords:
            raise _unsupported(
                path,
                f"the keyword{'s' * (len(unknown_keywords) > 1)} {', '.join(unknown_keywords)}",
                "Drop it and check the value after parsing, or describe the constraint "
                "with const/enum/anyOf.",
            )
        declared = schema.get("type")
        if declared is None:
            if not validation:
                return [self._use("value")]
            # As xgrammar does: properties make an object, items an array.
            if "properties" in validation and validation <= _TYPE_KEYWORDS["object"]:
                types = ["object"]
            elif "items" in validation and validation <= _TYPE_KEYWORDS["array"]:
                types = ["array"]
            else:
                raise _unsupported(
                    path,
                    f"{', '.join(sorted(validation))} without a type",
                    'Add a "type" to the schema.',
                )
        elif isinstance(declared, str):
            types = [declared]
        elif isinstance(declared, list) and declared and all(isinstance(t, str) for t in declared):
            types = list(dict.fromkeys(declared))
        else:
            raise _malformed(path, "type must be a type name or a non-empty list of them")
        unknown = [t for t in types if t not in _TYPE_KEYWORDS]
        if unknown:
            raise _malformed(path, f"unknown type {unknown[0]!r}")
        allowed = set().union(*(_TYPE_KEYWORDS[t] for t in types)) | {"type"}
        extra = sorted(validation - allowed)
        if extra:
            raise _unsupported(
                path,
                f"{', '.join(extra)} (on {' or '.join(types)})",
                "Drop the keyword and check the value after parsing, or describe the "
                "constraint with enum/const.",
            )
        alternatives: list[str] = []
        for type_name in types:
            if type_name == "object":
                alternatives += self._object(schema, path, hint)
            elif type_name == "array":
                alternatives += self._array(schema, path, hint)
            else:
                alternatives.append(self._use(type_name))
        return alternatives

    def _object(self, schema: Mapping[str, Any], path: str, hint: str) -> list[str]:
        properties = schema.get("properties")
        required = schema.get("required", [])
        additional = schema.get("additionalProperties", False)
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise _malformed(path, "required must be a list of property names")
        if properties is not None and not isinstance(properties, Mapping):
            raise _malformed(path, "properties must be an object")
        if not {"properties", "required", "additionalProperties"} & set(schema):
            return [self._use("object")]  # xgrammar: a bare object type is any object
        named = dict(properties or {})
        missing = sorted(set(required) - set(named))
        if missing:
            raise _unsupported(
                path,
                f"required properties with no schema in properties ({', '.join(missing)}; "
                "xgrammar allows no other keys, so they could never be written)",
                "Describe them under properties, or drop them from required.",
            )
        ws = self._use("ws")
        if not named:
            if additional is False:
                return [f'"{{" {ws} "}}"']
            value = self._guarded(additional, f"{path}/additionalProperties", f"{hint}-value")
            if value == "value":
                return [self._use("object")]
            key = self._use("string")
            more = self._new_rule(f"{hint}-more")
            self._rules[more] = f'{ws} "," {ws} {key} {ws} ":" {ws} {value}'
            return [f'"{{" {ws} "}}"', f'"{{" {ws} {key} {ws} ":" {ws} {value} {more}* {ws} "}}"']
        if additional is not False:
            raise _unsupported(
                path,
                "additionalProperties next to properties (xgrammar keeps the extra keys "
                "distinct from the named ones)",
                "Set additionalProperties to false, or name every property.",
            )
        pairs = []
        for key, subschema in named.items():
            _check_json_value(key, path)
            value = self._guarded(subschema, f"{path}/properties/{key}", f"{hint}-{key}")
            pairs.append(_sequence(_gbnf_literal(_json_text(key)), ws, '":"', ws, value))
        is_required = [key in required for key in named]
        # rest[i]: what may follow once a property before i was written, with the
        # properties i.. left to write ("" when none are left). The first written
        # property is chosen in the object's own alternatives, so rest[0] is never needed.
        rest: list[str] = [""] * (len(pairs) + 1)
        for index in range(len(pairs) - 1, 0, -1):
            then = _sequence(ws, '","', ws, pairs[index], rest[index + 1])
            if is_required[index]:
                body = then
            elif rest[index + 1]:
                body = f"{then} | {rest[index + 1]}"
            else:
                body = f"({then})?"
            rest[index] = self._new_rule(f"{hint}-rest-{index}")
            self._rules[rest[index]] = body
        first_required = is_required.index(True) if True in is_required else len(pairs) - 1
        alternatives = [
            _sequence('"{"', ws, pairs[index], rest[index + 1], ws, '"}"')
            for index in range(first_required + 1)
        ]
        if True not in is_required:
            alternatives.append(f'"{{" {ws} "}}"')
        return alternatives

    def _array(self, schema: Mapping[str, Any], path: str, hint: str) -> list[str]:
        ws = self._use("ws")
        bounds = {}
        for keyword in ("minItems", "maxItems"):
            count = schema.get(keyword)
            if count is None:
                continue
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise _malformed(path, f"{keyword} must be a non-negative integer")
            if count > _MOST_REPEATS:
                raise _unsupported(
                    path,
                    f"{keyword} {count} (llama.cpp repeats a grammar item at most 1999 times)",
                    f"Use a bound of at most {_MOST_REPEATS}.",
                )
            bounds[keyword] = count
        least, most = bounds.get("minItems", 0), bounds.get("maxItems")
        if "items" not in schema:
            if bounds:
                raise _unsupported(
                    path,
                    "minItems/maxItems without items (xgrammar then allows no items at all)",
                    'Add "items" (true for any value).',
                )
            return [self._use("array")]
        items = schema["items"]
        if most is not None and least > most:
            raise _malformed(path, f"minItems {least} is more than maxItems {most}")
        empty = f'"[" {ws} "]"'
        if items is False or most == 0:
            if least > 0:
                raise _unsupported(
                    path, "an array that must have items but may have none", "Fix the bounds."
                )
            return [empty]
        item = self._guarded(items, f"{path}/items", f"{hint}-item")
        more = self._new_rule(f"{hint}-more")
        self._rules[more] = f'{ws} "," {ws} {item}'
        low, high = max(least - 1, 0), None if most is None else most - 1
        if high == 0:
            repeated = ""
        elif high is None:
            repeated = f"{more}*" if low == 0 else f"{more}{{{low},}}"
        elif low == high:
            repeated = f"{more}{{{low}}}"
        else:
            repeated = f"{more}{{{low},{high}}}"
        filled = _sequence('"["', ws, item, repeated, ws, '"]"')
        return [filled, empty] if least == 0 else [filled]
