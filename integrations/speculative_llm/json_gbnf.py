r"""JSON schemas as GBNF grammars for llama-server, in the language the local engine uses.

The local engine constrains a schema with the grammar xgrammar compiles for it
(``compile_json_schema(schema, any_whitespace=True, max_whitespace_cnt=2)``).
llama-server converts a ``json_schema`` with its own converter, which allows other
whitespace (``" " | "\n"{1,2} [ \t]{0,20}``) between tokens: a small model then writes
different JSON on the two sides and they do different work. ``json_schema_gbnf`` hands
llama-server xgrammar's own grammar of the schema instead, as GBNF (the ``grammar`` field
of ``/completion`` and ``/v1/chat/completions``), so both sides are constrained by the
same grammar.

Why a translation of xgrammar's printed grammar, and not a converter of our own nor
llama.cpp's (decided 2026-12-06 with xgrammar 0.2.9 and llama-server b11434, issue 35):

- llama.cpp's ``json_schema_to_grammar`` (common/json-schema-to-grammar.cpp, and the
  Python copy in examples/) and llama-server's ``json_schema`` field write their own
  whitespace rule above, with no setting for it: not the local engine's language.
- The hand-written converter this replaced (611 lines) mirrored xgrammar's choices one
  by one and refused every keyword it did not mirror (formats, lengths, numeric bounds,
  ``prefixItems``, additional properties next to named ones: ``ConfigError``, and the
  bench fell back to llama-server's whitespace). The translation covers what xgrammar
  covers and follows it as it changes.
- ``str(xgrammar.Grammar.from_json_schema(...))`` is xgrammar's EBNF, which llama-server
  refuses as it is ("failed to parse grammar"). ``_as_gbnf`` rewrites: rule names with
  ``_`` (GBNF allows letters, digits and ``-``); unbounded repeats ``{n, -1}`` (GBNF:
  ``{n,}``); lookahead assertions ``(= ...)`` at the end of a rule, dropped (xgrammar
  uses them to precompute token masks, its matcher does not check them: the language is
  the same); and every character of strings and classes, written again with the escapes
  both parsers read alike. ``\0 \' \? \e \a \b \f \v`` are xgrammar's only, and ``\x``
  differs: llama.cpp reads two hex digits after it, xgrammar all that follow, so
  ``\x22city`` is ``"city`` to llama.cpp and U+22C then ``ity`` to xgrammar. A first
  version wrote ``\x``: its grammars were right for llama-server but
  tests/unit/test_json_gbnf.py (which compiles them back with xgrammar) failed on every
  schema with a key or value starting with a-f; ``\u`` (4 digits) has one reading.
- llama.cpp refuses left recursion, which xgrammar accepts (a ``$ref`` that reaches
  itself with no JSON in between): ``_left_recursive`` finds it first.

tests/unit/test_json_gbnf.py checks, string by string, that the GBNF (compiled back by
xgrammar) allows exactly what xgrammar's schema grammar allows;
tests/integration/test_json_gbnf_llama_server.py that llama-server parses the grammars
and writes under them what xgrammar's grammar allows.

Refused with ``ConfigError`` (the bench then lets llama-server convert the schema
itself): schemas xgrammar refuses, a string ``pattern`` (xgrammar keeps it as a
``Regex(...)`` node, which GBNF cannot carry), repeat bounds over 1000 (llama.cpp repeats
an item at most 1999 times), left recursion, and any other xgrammar construct GBNF lacks.
Keywords xgrammar ignores (``not``, ``if``, ``allOf`` of several schemas...) are ignored
here too: the language is the local engine's, whatever the schema says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeAlias

from speculative_llm.errors import ConfigError, MissingDependencyError

__all__ = ["JSON_WHITESPACE", "json_schema_gbnf"]

JSON_WHITESPACE = 2
"""Most whitespace characters between two JSON tokens in the local engine's schema grammars
(``engine.request.grammar`` compiles them with it) and in the GBNF written here."""

_FIELD = "response_format"

_MOST_REPEATS = 1000
"""Largest repeat bound and max_whitespace: llama.cpp refuses to repeat an item 2000
times or more, and reads a larger upper bound as none."""

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<literal>"(?:[^"\\]|\\.)*")
    | (?P<char_class>\[(?:[^\]\\]|\\.)*\])
    | (?P<lookahead>\(=)
    | (?P<call>[A-Za-z_][A-Za-z0-9_]*\()
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<repeat>\{\s*(?P<least>\d+)\s*(?P<comma>,\s*(?P<most>-?\d+)?\s*)?\})
    | (?P<operator>[()|*+?])
    """,
    re.VERBOSE,
)
"""One token of xgrammar's printed EBNF (strings and classes keep their escapes)."""

_SIMPLE_ESCAPES: Mapping[str, int] = {
    "0": 0x00,
    "a": 0x07,
    "b": 0x08,
    "t": 0x09,
    "n": 0x0A,
    "v": 0x0B,
    "f": 0x0C,
    "r": 0x0D,
    "e": 0x1B,
}
"""xgrammar's escapes of one letter; any other escaped character stands for itself."""

_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
"""Digits of xgrammar's printed hex escapes (its printer writes two after ``x``)."""

_SHARED_ESCAPES: Mapping[str, str] = {
    '"': '\\"',
    "\\": "\\\\",
    "\t": "\\t",
    "\n": "\\n",
    "\r": "\\r",
}
"""Characters both GBNF parsers (llama.cpp's and xgrammar's) read from these escapes."""

_CALLS: Mapping[str, str] = {
    "Regex": "a string pattern (xgrammar keeps it as a regular expression, Regex(...))",
}
"""What the xgrammar constructs GBNF has no counterpart for come from in a schema."""

_NATIVE_PREFIX = re.compile(r"^\s*(?:\[[\d:]+\]\s*)?(?:\S+\.(?:cc|cpp|h):\d+:\s*)?")


def json_schema_gbnf(schema: Mapping[str, Any], *, max_whitespace: int = JSON_WHITESPACE) -> str:
    """The local engine's grammar of ``schema`` (xgrammar's), written as GBNF.

    The grammar is ``xgrammar.Grammar.from_json_schema(json.dumps(schema),
    any_whitespace=True, max_whitespace_cnt=max_whitespace)`` in llama.cpp's dialect, so
    llama-server (given it as ``grammar``) and the local engine constrain a generation
    identically. See the module docstring for what is rewritten and what is refused.

    Args:
        schema: The JSON schema, as a mapping.
        max_whitespace: Most whitespace characters between two JSON tokens (the local
            engine's, ``JSON_WHITESPACE``, by default); at least 1, as xgrammar requires.

    Returns:
        The grammar's text, with the start rule ``root``; ASCII only.

    Raises:
        ConfigError: ``field="response_format"``: xgrammar refuses the schema, or its
            grammar uses a construct GBNF cannot say (the message names it).
        MissingDependencyError: xgrammar (the ``local`` extra) is not installed.
    """
    if isinstance(max_whitespace, bool) or not isinstance(max_whitespace, int):
        raise ConfigError(
            f"max_whitespace must be an integer, not {max_whitespace!r}.", field=_FIELD
        )
    if not 1 <= max_whitespace <= _MOST_REPEATS:
        raise ConfigError(
            f"max_whitespace must be from 1 (xgrammar, whose grammar this is, allows no "
            f"less) to {_MOST_REPEATS}, not {max_whitespace}.",
            field=_FIELD,
        )
    if not isinstance(schema, Mapping):
        raise ConfigError(
            f"The JSON schema must be an object, not {type(schema).__name__}.", field=_FIELD
        )
    try:
        import xgrammar
    except ImportError as error:
        raise MissingDependencyError(
            "xgrammar", "grammar", "Writing the local engine's JSON grammar for llama-server"
        ) from error
    try:
        grammar = xgrammar.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=True, max_whitespace_cnt=max_whitespace
        )
    except (RuntimeError, ValueError, TypeError) as error:
        reason = " ".join(_NATIVE_PREFIX.sub("", str(error)).split()).rstrip(".")
        raise ConfigError(
            f"The JSON schema cannot be turned into a grammar: {reason or type(error).__name__}."
            " Simplify the schema (objects, arrays, strings, numbers, enums, const, "
            "anyOf/oneOf and local $ref).",
            field=_FIELD,
        ) from error
    return _as_gbnf(str(grammar))


def _as_gbnf(ebnf: str) -> str:
    """The EBNF xgrammar prints, in llama.cpp's GBNF dialect (see the module docstring)."""
    rules: dict[str, list[str]] = {}
    for line in ebnf.splitlines():
        if not line.strip():
            continue
        name, separator, body = line.partition(" ::= ")
        if not separator or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise _untranslatable(f"the line {line!r}")
        rules[_rule_name(name)] = list(_body(body))
    looping = _left_recursive(rules)
    if looping is not None:
        raise _untranslatable(
            f"left recursion (the rule {looping} can reach itself before any character, as a "
            "$ref that reaches itself with no JSON in between does; llama.cpp refuses it)"
        )
    names = sorted(rules, key=lambda name: name != "root")  # root first, for readers
    return "".join(f"{name} ::= {_joined(rules[name])}\n" for name in names)


_Item: TypeAlias = "tuple[str | list[list[_Item]], bool]"
"""One item of a sequence: a token or a group (alternatives of sequences), and whether
its repeat allows it to be absent."""


def _left_recursive(rules: Mapping[str, list[str]]) -> str | None:
    """A rule that can reach itself with nothing consumed, or None (there is none)."""
    trees = {name: _group(tokens, 0)[0] for name, tokens in rules.items()}
    empty: set[str] = set()  # the rules that can match the empty string
    grown = True
    while grown:
        grown = False
        for name, tree in trees.items():
            if name not in empty and _may_be_empty(tree, empty):
                empty.add(name)
                grown = True
    first = {name: _leading_rules(tree, empty) for name, tree in trees.items()}
    for start in first:
        seen, stack = set(), list(first[start])
        while stack:
            name = stack.pop()
            if name == start:
                return start
            if name not in seen:
                seen.add(name)
                stack.extend(first.get(name, ()))
    return None


def _group(tokens: list[str], index: int) -> tuple[list[list[_Item]], int]:
    """The alternatives from ``tokens[index]`` up to the closing parenthesis (or the end)."""
    alternatives: list[list[_Item]] = [[]]
    while index < len(tokens) and tokens[index] != ")":
        token = tokens[index]
        if token == "|":
            alternatives.append([])
            index += 1
            continue
        atom: str | list[list[_Item]] = token
        if token == "(":
            atom, index = _group(tokens, index + 1)
        index += 1
        optional = False
        if index < len(tokens) and tokens[index][0] in "*+?{":
            optional = tokens[index] in {"*", "?"} or tokens[index].startswith("{0")
            index += 1
        alternatives[-1].append((atom, optional))
    return alternatives, index


def _may_be_empty(alternatives: list[list[_Item]], empty: set[str]) -> bool:
    return any(
        all(_item_may_be_empty(item, empty) for item in sequence) for sequence in alternatives
    )


def _item_may_be_empty(item: _Item, empty: set[str]) -> bool:
    atom, optional = item
    if optional or atom == '""':
        return True
    return _may_be_empty(atom, empty) if isinstance(atom, list) else atom in empty


def _leading_rules(alternatives: list[list[_Item]], empty: set[str]) -> set[str]:
    """The rules an alternative can start with (after items that may be empty)."""
    found: set[str] = set()
    for sequence in alternatives:
        for item in sequence:
            atom = item[0]
            if isinstance(atom, list):
                found |= _leading_rules(atom, empty)
            elif atom[0] not in '"[':
                found.add(atom)
            if not _item_may_be_empty(item, empty):
                break
    return found


def _joined(tokens: Iterable[str]) -> str:
    """Tokens spaced as xgrammar prints them: none inside brackets or before operators."""
    text = ""
    for token in tokens:
        glued = not text or text.endswith("(") or token == ")" or token[0] in "*+?{"
        text += token if glued else " " + token
    return text


def _untranslatable(what: str) -> ConfigError:
    return ConfigError(
        f"xgrammar's grammar of this JSON schema has {what}, which json_schema_gbnf cannot "
        "write as GBNF for llama-server. Simplify the schema, or leave llama-server to "
        "convert it (response_format) with its own whitespace rules.",
        field=_FIELD,
    )


def _rule_name(name: str) -> str:
    # xgrammar's names are letters, digits and "_", so the rewrite keeps them distinct.
    return name.replace("_", "-")


def _body(body: str) -> Iterator[str]:
    """The GBNF tokens of one rule's right-hand side."""
    lookahead_depth = 0
    position = 0
    while position < len(body):
        match = _TOKEN.match(body, position)
        if match is None:
            raise _untranslatable(f"the text {body[position : position + 20]!r}")
        position = match.end()
        kind, text = match.lastgroup, match.group()
        if kind == "space":
            continue
        if lookahead_depth:
            # Inside a lookahead assertion: dropped (xgrammar does not enforce it).
            lookahead_depth += text in {"(", "(="}
            lookahead_depth -= text == ")"
        elif kind == "lookahead":
            lookahead_depth = 1
        elif kind == "call":
            call = text[:-1]
            raise _untranslatable(_CALLS.get(call, f"the construct {call}(...)"))
        elif kind == "name":
            yield _rule_name(text)
        elif kind == "literal":
            characters = _characters(text[1:-1])
            yield '"' + "".join(_gbnf_char(code, in_class=False) for _, code in characters) + '"'
        elif kind == "char_class":
            yield _char_class(text[1:-1])
        elif kind == "repeat":
            yield _repeat(match)
        else:
            yield text


def _repeat(match: re.Match[str]) -> str:
    least = int(match["least"])
    most = None if match["comma"] is None else match["most"]
    bounds = [least] + ([int(most)] if most not in {None, "-1"} else [])
    if max(bounds) > _MOST_REPEATS:
        raise _untranslatable(
            f"the repeat {match.group()} (from minItems/maxItems/minLength... over "
            f"{_MOST_REPEATS}; llama.cpp repeats an item at most 1999 times)"
        )
    if most is None:
        return f"{{{least}}}"
    return f"{{{least},}}" if most == "-1" else f"{{{least},{most}}}"


def _characters(escaped: str) -> Iterator[tuple[bool, int]]:
    """The characters of a string or class body as (escaped, code point)."""
    index = 0
    while index < len(escaped):
        char = escaped[index]
        if char != "\\":
            yield False, ord(char)
            index += 1
            continue
        letter = escaped[index + 1]
        digits = _HEX_DIGITS.get(letter)
        if digits is not None:
            hex_text = escaped[index + 2 : index + 2 + digits]
            if not re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", hex_text):
                raise _untranslatable(f"the escape {escaped[index : index + 2 + digits]!r}")
            yield True, int(hex_text, 16)
            index += 2 + digits
        else:
            yield True, _SIMPLE_ESCAPES.get(letter, ord(letter))
            index += 2


def _char_class(body: str) -> str:
    """A character class body in GBNF: ``^`` and range dashes kept, characters rewritten."""
    parts = ["["]
    characters = list(_characters(body))
    if characters and characters[0] == (False, ord("^")):
        parts.append("^")
        characters = characters[1:]
    for escaped, code in characters:
        # An unescaped "-" between two characters is a range; escaped, it is a dash.
        parts.append("-" if not escaped and code == ord("-") else _gbnf_char(code, in_class=True))
    parts.append("]")
    return "".join(parts)


def _gbnf_char(code: int, *, in_class: bool) -> str:
    r"""One character as both llama.cpp and xgrammar read it: printable ASCII as is.

    The rest is escaped with the escapes the two parse alike: ``\"``, ``\\``, ``\t``,
    ``\n``, ``\r``, and in classes ``\[``, ``\]``, ``\-``; other characters as ``\u``
    (4 digits) or ``\U`` (8), never ``\x``: llama.cpp reads two digits after it, xgrammar
    every hex digit that follows, so ``\x22c`` would be ``"c`` to one and U+022C to the
    other.
    """
    char = chr(code)
    if char in _SHARED_ESCAPES:
        return _SHARED_ESCAPES[char]
    if in_class and char in "[]-^":
        # "^" is special only first in a class, and neither parser has an escape for it.
        return "\\u005E" if char == "^" else "\\" + char
    if 0x20 <= code < 0x7F:
        return char
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"
