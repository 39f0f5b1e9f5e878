"""A forced tool choice is a real tool call on every backend (no sockets).

``tool_choice="required"`` or a named tool must come back as a call with valid arguments.
llama-server ignores both (tests/fixtures/llamacpp/chat_required_ignored.json: "2 + 3 = 5",
no call) and vLLM refuses them without a tool parser, so their backends send them in the
JSON tool protocol of ``json_tools``, which the server's grammar enforces
(``chat_forced_tool.json`` of each); the other engines constrain a forced call themselves
and get the choice as OpenAI spells it. How the fixtures were recorded:
tests/fixtures/README.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from backend_parsing import URL, pieces

from fakeserver import fixture_bytes, fixture_json
from speculative_llm import Chunk, Completion, ConfigError, GenerationRequest, Message
from speculative_llm.backends.base import ModelInfo
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.json_tools import as_json_tool_request, chosen_tools, forces_tool_call
from tool_schemas import ADD_TOOL

ADD = fixture_json("llamacpp/chat_forced_tool.json")  # the recorded enforced answer
MUL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "mul", "parameters": {"type": "object", "properties": {}}},
}
NAMED = {"type": "function", "function": {"name": "add"}}
QUESTION = (Message("user", "What is 2 + 3?"),)


def ask(tool_choice: str | dict[str, Any] | None, *tools: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(
        messages=QUESTION,
        tools=tools or (ADD_TOOL,),
        tool_choice=tool_choice,
        max_tokens=48,
        temperature=0.0,
    )


def schema_of(body: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = body["response_format"]["json_schema"]["schema"]
    return schema


# ---- which tools a choice offers (json_tools) ------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "offered", "allow_answer"),
    [
        (None, ("add", "mul"), True),
        ("auto", ("add", "mul"), True),
        ("required", ("add", "mul"), False),
        ("any", ("add", "mul"), False),
        ("mul", ("mul",), False),
        ({"type": "function", "function": {"name": "mul"}}, ("mul",), False),
    ],
)
def test_a_choice_offers_its_tools(
    choice: str | dict[str, Any] | None, offered: tuple[str, ...], allow_answer: bool
) -> None:
    chosen = chosen_tools([ADD_TOOL, MUL_TOOL], choice)
    assert chosen is not None
    tools, answer_allowed = chosen
    assert tuple(tool["function"]["name"] for tool in tools) == offered
    assert answer_allowed is allow_answer


def test_none_offers_no_tool_and_an_unknown_name_is_refused() -> None:
    assert chosen_tools([ADD_TOOL], "none") is None
    with pytest.raises(ConfigError, match=r"names no tool of this request.*'add'") as caught:
        chosen_tools([ADD_TOOL], {"type": "function", "function": {"name": "sub"}})
    assert caught.value.field == "tool_choice"
    with pytest.raises(ConfigError, match=r"not a form the JSON tool protocol can follow"):
        chosen_tools([ADD_TOOL], {"type": "allowed_tools"})


@pytest.mark.parametrize(
    ("choice", "forced"),
    [
        (None, False),
        ("auto", False),
        ("none", False),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, False),
        ("required", True),
        ("add", True),
        (NAMED, True),
    ],
)
def test_which_choices_force_a_call(choice: str | dict[str, Any] | None, forced: bool) -> None:
    assert forces_tool_call(ask(choice)) is forced
    assert not forces_tool_call(GenerationRequest(prompt="2 + 3 =", tools=(ADD_TOOL,)))


def test_a_named_choice_constrains_the_answer_to_that_tool_alone() -> None:
    rewritten, json_tools = as_json_tool_request(ask(NAMED, MUL_TOOL, ADD_TOOL))
    assert json_tools and rewritten.tools is None and rewritten.tool_choice is None
    schema = rewritten.response_format["json_schema"]["schema"]  # type: ignore[index]
    # One call form, of add: no answer, no mul.
    assert schema["properties"]["tool"] == {"const": "add"}
    assert schema["properties"]["arguments"] == ADD_TOOL["function"]["parameters"]
    system = rewritten.messages[0]  # type: ignore[index]
    assert system.role == "system" and "- add:" in system.content and "mul" not in system.content


# ---- each backend's translation ------------------------------------------------------------


ENFORCING = [LlamaCppBackend(URL), VLLMBackend(URL)]
"""Backends whose servers do not enforce a forced choice: the client does."""


@pytest.mark.parametrize("backend", ENFORCING, ids=lambda backend: backend.name)
@pytest.mark.parametrize("choice", ["required", NAMED, "add"])
def test_a_forced_choice_goes_as_response_format_where_the_server_would_not_enforce_it(
    backend: OpenAICompatibleBackend, choice: str | dict[str, Any]
) -> None:
    body = backend.build_body(ask(choice, ADD_TOOL, MUL_TOOL), stream=False)
    assert "tools" not in body and "tool_choice" not in body
    schema = schema_of(body)
    # A call is the only answer: no {"answer": ...} alternative.
    calls = schema.get("anyOf", [schema])
    assert all(set(call["required"]) == {"tool", "arguments"} for call in calls)
    names = {call["properties"]["tool"]["const"] for call in calls}
    assert names == ({"add", "mul"} if choice == "required" else {"add"})
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][-1] == {"role": "user", "content": "What is 2 + 3?"}


@pytest.mark.parametrize("backend", ENFORCING, ids=lambda backend: backend.name)
@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_other_choices_go_as_they_are(backend: OpenAICompatibleBackend, choice: str | None) -> None:
    body = backend.build_body(ask(choice), stream=False)
    assert body["tools"] == [ADD_TOOL] and "response_format" not in body
    assert body.get("tool_choice") == choice


@pytest.mark.parametrize(
    "backend",
    [
        SGLangBackend(URL),
        TGIBackend(URL),
        LMStudioBackend(URL),
        OpenAICompatibleBackend(URL),
    ],
    ids=lambda backend: backend.name,
)
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_engines_that_enforce_a_forced_choice_get_it_as_openai_spells_it(
    backend: OpenAICompatibleBackend, choice: str | dict[str, Any]
) -> None:
    body = backend.build_body(ask(choice), stream=False)
    assert body["tools"] == [ADD_TOOL] and body["tool_choice"] == choice
    assert "response_format" not in body
    assert body["messages"] == [{"role": "user", "content": "What is 2 + 3?"}]


# ---- the recorded answers -----------------------------------------------------------------

RECORDED = [
    (LlamaCppBackend(URL), "llamacpp/chat_forced_tool.json"),
    (VLLMBackend(URL), "vllm/chat_forced_tool.json"),
]


@pytest.mark.parametrize(("backend", "answer"), RECORDED, ids=["llamacpp", "vllm"])
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_the_enforced_answer_is_a_tool_call(
    backend: OpenAICompatibleBackend, answer: str, choice: str | dict[str, Any]
) -> None:
    data = fixture_json(answer)
    completion = backend.parse_response(ask(choice), data)
    (call,) = completion.tool_calls
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert call.id.startswith("call_")
    assert completion.text == "" and completion.finish_reason == "tool_calls"
    stats = completion.stats
    assert (stats.backend, stats.source) == (backend.name, "exact")
    assert stats.generated_tokens == data["usage"]["completion_tokens"]


@pytest.mark.parametrize(
    ("backend", "stream", "generated"),
    [
        (LlamaCppBackend(URL), "llamacpp/chat_stream_forced_tool_timings.sse", 37),
        (VLLMBackend(URL), "vllm/chat_stream_forced_tool.sse", 32),
    ],
    ids=["llamacpp", "vllm"],
)
def test_the_streamed_enforced_answer_ends_with_the_call(
    backend: OpenAICompatibleBackend, stream: str, generated: int
) -> None:
    chunks = list(backend.replay_stream(ask(NAMED), pieces(fixture_bytes(stream))))
    (final,) = chunks  # parsed whole: the JSON is not shown as text
    assert final.final and final.text == "" and final.finish_reason == "tool_calls"
    (call,) = final.tool_calls
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert final.stats is not None and final.stats.generated_tokens == generated


def test_a_call_cut_by_max_tokens_is_no_call() -> None:
    """Never a guess: a JSON call the budget cut is returned as the text it is."""
    data = json.loads(json.dumps(ADD))
    cut = data["choices"][0]["message"]["content"][:20]
    data["choices"][0]["message"]["content"] = cut
    data["choices"][0]["finish_reason"] = "length"
    completion = LlamaCppBackend(URL).parse_response(ask("required"), data)
    assert completion.tool_calls == () and completion.finish_reason == "length"
    assert completion.text == cut


# ---- the adapters, on llama-server's recorded answers -------------------------------------


class RecordedLlamaServer(LlamaCppBackend):
    """llama-server's backend answering from recorded bodies; keeps the bodies it would send.

    ``generate``/``stream`` (and their async twins) parse the recordings exactly as the
    live ones would (``parse_response``, ``replay_stream``): no socket is opened.
    """

    def __init__(self) -> None:
        super().__init__(URL)
        self.sent: list[dict[str, Any]] = []

    def model_info(self) -> ModelInfo:
        return ModelInfo(name="SmolLM2-135M-Instruct.Q4_1.gguf")

    def generate(self, request: GenerationRequest) -> Completion:
        self.check_request(request)
        self.sent.append(self.build_body(request, stream=False))
        return self.parse_response(request, ADD)

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        self.check_request(request)
        self.sent.append(self.build_body(request, stream=True))
        body = fixture_bytes("llamacpp/chat_stream_forced_tool_timings.sse")
        yield from self.replay_stream(request, pieces(body))

    async def agenerate(self, request: GenerationRequest) -> Completion:
        return self.generate(request)

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for chunk in self.stream(request):
            yield chunk


def sent_a_forced_call(backend: RecordedLlamaServer) -> None:
    """Every body asked for a call of add, through response_format, with no tools field."""
    assert backend.sent
    for body in backend.sent:
        assert "tools" not in body and "tool_choice" not in body
        assert schema_of(body)["properties"]["tool"] == {"const": "add"}


@pytest.mark.parametrize("choice", ["add", "any", True, "required", NAMED])
def test_langchain_bind_tools_with_a_forced_choice_calls_the_tool(choice: Any) -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is not installed")
    from langchain_core.messages import AIMessageChunk
    from langchain_core.tools import tool

    from langchain_speculative import ChatSpeculative

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers and return the sum."""
        return a + b

    backend = RecordedLlamaServer()
    bound = ChatSpeculative(backend=backend).bind_tools([add], tool_choice=choice)
    reply = bound.invoke("What is 2 + 3?")
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert reply.content == ""
    call_chunks = [
        call
        for chunk in bound.stream("What is 2 + 3?")
        if isinstance(chunk, AIMessageChunk)
        for call in chunk.tool_call_chunks
    ]
    (call_chunk,) = call_chunks  # the whole call, in one chunk
    assert call_chunk["name"] == "add" and json.loads(call_chunk["args"] or "") == {"a": 2, "b": 3}
    async_reply = asyncio.run(bound.ainvoke("What is 2 + 3?"))
    assert [c["name"] for c in async_reply.tool_calls] == ["add"]
    sent_a_forced_call(backend)


@pytest.mark.parametrize(
    "forcing", [{"tool_choice": "add"}, {"tool_required": True}, {"tool_choice": NAMED}]
)
def test_llamaindex_predict_and_call_with_a_forced_choice_runs_the_tool(
    forcing: dict[str, Any],
) -> None:
    pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")
    from llama_index.core.tools import FunctionTool

    from llama_index.llms.speculative import Speculative

    def add(a: int, b: int) -> int:
        """Add two integers and return the sum."""
        return a + b

    backend = RecordedLlamaServer()
    llm = Speculative(backend)
    tool = FunctionTool.from_defaults(fn=add)
    result = llm.predict_and_call([tool], user_msg="What is 2 + 3?", **forcing)
    (output,) = result.sources
    assert output.tool_name == "add" and output.raw_input["kwargs"] == {"a": 2, "b": 3}
    assert output.raw_output == 5 and not output.is_error
    sent_a_forced_call(backend)
