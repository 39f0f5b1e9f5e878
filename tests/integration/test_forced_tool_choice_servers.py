"""A forced tool choice calls the tool on llama-server and vLLM, as on the local engine.

llama-server reads ``tool_choice`` as a string (a named function is served as ``auto``)
and, on SmolLM2's own chat template, drops the tools: LangChain's
``bind_tools([add], tool_choice="add")`` got "2 + 3 = 5" and LlamaIndex's
``predict_and_call`` "the model answered with text only". vLLM refuses a forced choice
without a tool parser (HTTP 400). Both backends now send a forced choice in the JSON tool
protocol, which the server's grammar enforces: these tests run the two adapters against
real servers (the packaged SmolLM2-135M, n-gram drafting), and the HTTP shells (sync,
async, streamed) against the fake server with a recorded answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from fakeserver import FakeServer, Reply, fixture_bytes, fixture_json
from speculative_llm import Chunk, Completion, GenerationRequest, Message
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from tool_schemas import ADD_TOOL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUESTION = "What is 2 + 3?"
CHAT_PATH = "/v1/chat/completions"


def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return a + b


def assert_add_call(name: str, arguments: Any) -> None:
    """A call of add with two integers: what its schema asks for, whatever the model chose."""
    assert name == "add"
    assert set(arguments) == {"a", "b"}
    assert all(type(value) is int for value in arguments.values()), arguments


# ---- the HTTP shells, against the fake server ----------------------------------------------


def forced(tool_choice: str | dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", QUESTION),),
        tools=(ADD_TOOL,),
        tool_choice=tool_choice,
        max_tokens=48,
        temperature=0.0,
    )


@pytest.fixture
def recorded_llama_server(server: FakeServer) -> FakeServer:
    """The fake server answering as llama-server did to the enforced request."""
    server.route("GET", "/slots", Reply(json=fixture_json("llamacpp/slots_plain.json")))
    server.route(
        "POST",
        CHAT_PATH,
        Reply(json=fixture_json("llamacpp/chat_forced_tool.json")),
        Reply(stream=fixture_bytes("llamacpp/chat_stream_forced_tool_timings.sse"), chunk_size=29),
    )
    return server


def sent_the_json_protocol(server: FakeServer) -> None:
    for request in server.requests_to(CHAT_PATH):
        body = request.json()
        assert "tools" not in body and "tool_choice" not in body
        schema = body["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["tool"] == {"const": "add"}


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "add"}}]
)
def test_generate_and_stream_return_the_call(
    recorded_llama_server: FakeServer, tool_choice: str | dict[str, Any]
) -> None:
    with LlamaCppBackend(recorded_llama_server.url) as backend:
        completion = backend.generate(forced(tool_choice))
        chunks = list(backend.stream(forced(tool_choice)))
    (call,) = completion.tool_calls
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 3})
    assert completion.finish_reason == "tool_calls" and completion.text == ""
    (final,) = chunks
    assert final.final and final.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in final.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert final.stats is not None and final.stats.backend == "llamacpp"
    sent_the_json_protocol(recorded_llama_server)


def test_async_generate_and_stream_return_the_call(recorded_llama_server: FakeServer) -> None:
    async def both() -> tuple[Completion, list[Chunk]]:
        async with LlamaCppBackend(recorded_llama_server.url) as backend:
            completion = await backend.agenerate(forced("required"))
            return completion, [chunk async for chunk in backend.astream(forced("required"))]

    completion, chunks = asyncio.run(both())
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert [(c.name, c.arguments) for c in chunks[-1].tool_calls] == [("add", {"a": 2, "b": 3})]
    sent_the_json_protocol(recorded_llama_server)


# ---- both adapters, against a real llama-server ----------------------------------------------


@pytest.fixture(scope="module")
def chat_model(llama_server_ngram: Any) -> Iterator[Any]:
    """LangChain's chat model on the server that speaks SmolLM2's own template."""
    pytest.importorskip("langchain_core", reason="langchain-core is not installed")
    from langchain_speculative import ChatSpeculative

    chat = ChatSpeculative(
        backend="llamacpp", base_url=llama_server_ngram.base_url, temperature=0, max_tokens=64
    )
    yield chat
    chat.client.close()


@pytest.mark.parametrize("tool_choice", ["add", "required"])
def test_langchain_bind_tools_with_a_forced_choice_calls_the_tool(
    chat_model: Any, tool_choice: str
) -> None:
    from langchain_core.tools import tool

    bound = chat_model.bind_tools([tool(add)], tool_choice=tool_choice)
    reply = bound.invoke(QUESTION)
    (call,) = reply.tool_calls
    assert_add_call(call["name"], call["args"])
    assert reply.response_metadata["speculative"]["backend"] == "llamacpp"


def test_langchain_streamed_forced_choice_ends_with_the_call(chat_model: Any) -> None:
    from langchain_core.tools import tool

    bound = chat_model.bind_tools([tool(add)], tool_choice="add")
    calls = [c for chunk in bound.stream(QUESTION) for c in chunk.tool_call_chunks]
    (call,) = calls
    assert_add_call(call["name"] or "", json.loads(call["args"] or "{}"))


@pytest.fixture(scope="module")
def index_llm(llama_server_ngram: Any) -> Iterator[Any]:
    """LlamaIndex's LLM on the same server."""
    pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")
    from llama_index.llms.speculative import Speculative

    llm = Speculative("llamacpp", base_url=llama_server_ngram.base_url, max_tokens=64)
    yield llm
    llm.close()


@pytest.mark.parametrize("forcing", [{"tool_choice": "add"}, {"tool_required": True}])
def test_llamaindex_predict_and_call_with_a_forced_choice_runs_the_tool(
    index_llm: Any, forcing: dict[str, Any]
) -> None:
    from llama_index.core.tools import FunctionTool

    result = index_llm.predict_and_call(
        [FunctionTool.from_defaults(fn=add)], user_msg=QUESTION, **forcing
    )
    (output,) = result.sources
    arguments = output.raw_input["kwargs"]
    assert_add_call(output.tool_name, arguments)
    assert not output.is_error and output.raw_output == arguments["a"] + arguments["b"]


# ---- both adapters, against a real vLLM (no tool parser) -------------------------------------


def test_both_adapters_call_the_tool_on_vllm(vllm_server: Any) -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is not installed")
    pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")
    from langchain_core.tools import tool
    from llama_index.core.tools import FunctionTool

    from langchain_speculative import ChatSpeculative
    from llama_index.llms.speculative import Speculative

    options = {"base_url": vllm_server.base_url, "model": vllm_server.served_model_name}
    chat = ChatSpeculative(backend="vllm", temperature=0, max_tokens=64, **options)
    reply = chat.bind_tools([tool(add)], tool_choice="add").invoke(QUESTION)
    (call,) = reply.tool_calls
    assert_add_call(call["name"], call["args"])

    llm = Speculative("vllm", max_tokens=64, **options)
    result = llm.predict_and_call(
        [FunctionTool.from_defaults(fn=add)], user_msg=QUESTION, tool_required=True
    )
    llm.close()
    (output,) = result.sources
    assert_add_call(output.tool_name, output.raw_input["kwargs"])
    assert output.raw_output == sum(output.raw_input["kwargs"].values())
