"""same_work: requests that make llama-server do what the local engine does."""

from __future__ import annotations

import logging
import sys

import pytest

from speculative_llm import GenerationRequest, Message
from speculative_llm.bench.contenders import BackendContender
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import Variant
from speculative_llm.bench.same_work import as_the_local_engine_asks, with_local_json_grammar
from speculative_llm.json_gbnf import json_schema_gbnf
from speculative_llm.json_tools import json_tool_format, json_tool_messages

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = (Message("user", "Weather in Paris?"),)


def schema_of(response_format: dict) -> dict:  # type: ignore[type-arg]
    return dict(response_format["json_schema"]["schema"])


def test_tools_go_as_the_local_engine_offers_them_under_its_grammar() -> None:
    request = GenerationRequest(messages=ASK, max_tokens=32, tools=[WEATHER], extra={"seed": 1})
    sent = as_the_local_engine_asks(request)
    assert sent.tools is None and sent.tool_choice is None and sent.response_format is None
    assert sent.messages == json_tool_messages(ASK, [WEATHER], allow_answer=True)
    schema = schema_of(json_tool_format([WEATHER], allow_answer=True))
    assert sent.extra == {"seed": 1, "grammar": json_schema_gbnf(schema)}


def test_a_schema_goes_as_gbnf_and_plain_text_as_it_is() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    request = GenerationRequest(
        messages=ASK,
        max_tokens=32,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    sent = as_the_local_engine_asks(request)
    assert sent.response_format is None and sent.extra == {"grammar": json_schema_gbnf(schema)}
    plain = GenerationRequest(messages=ASK, max_tokens=32)
    assert as_the_local_engine_asks(plain) == plain


def test_a_schema_gbnf_cannot_mirror_stays_the_servers_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = GenerationRequest(
        prompt="p",
        max_tokens=8,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "^a+$"}},
        },
    )
    with caplog.at_level(logging.WARNING, logger="speculative_llm.bench.same_work"):
        assert with_local_json_grammar(request) == request
    assert "pattern" in caplog.text


def test_without_xgrammar_a_schema_stays_the_servers_with_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """json_schema_gbnf writes xgrammar's grammar: without xgrammar the bench goes on."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar -> ImportError
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    request = GenerationRequest(
        prompt="p",
        max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    with caplog.at_level(logging.WARNING, logger="speculative_llm.bench.same_work"):
        assert with_local_json_grammar(request) == request
    assert "xgrammar" in caplog.text


class _Recording:
    """The least of a backend a contender calls: ``generate``."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> object:
        self.requests.append(request)
        raise RuntimeError("recorded")


def test_a_contender_sends_its_prompts_as_prepared() -> None:
    backend = _Recording()
    contender = BackendContender(
        Variant("llama-server", "none"),
        backend,  # type: ignore[arg-type]
        None,
        prepare=as_the_local_engine_asks,
    )
    prompt = BenchPrompt(id="t", category="structured", messages=ASK, tools=(WEATHER,))
    with pytest.raises(RuntimeError, match="recorded"):
        contender.run(prompt, 16)
    (sent,) = backend.requests
    assert sent == as_the_local_engine_asks(prompt.request(16, None))
    assert sent.tools is None and "grammar" in sent.extra
