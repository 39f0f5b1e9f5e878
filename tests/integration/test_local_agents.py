"""Agents, tools and structured output on the embedded engine (SmolLM2-135M, llama.cpp runner).

As a user writes them: LangChain's ``create_agent``, ``bind_tools`` and
``with_structured_output`` (both methods), and LlamaIndex's ``FunctionAgent``,
``predict_and_call``, ``structured_predict`` and ``as_structured_llm``, all on
``backend="local"``. The engine constrains every answer with a grammar, so even a 135M
model gives well-formed calls and objects; what the model chooses to say is its own.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("xgrammar", reason="tool calls on the local engine need xgrammar ('local')")

from speculative_llm import Backend

pytestmark = pytest.mark.integration

QUESTION = "What is 17 + 25? Use the add tool."


def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return a + b


class City(BaseModel):
    """A city and the country it lies in."""

    name: str = Field(description="The city's name")
    country: str = Field(description="The country the city lies in")


def assert_plain_answer(text: str) -> None:
    """The user sees the answer's text: not the protocol's ``{"answer": ...}`` envelope."""
    assert text.strip(), "the agent gave no answer"
    assert not text.lstrip().startswith("{") and '"answer"' not in text, text


# ---- LangChain -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat(local: Backend) -> Any:
    pytest.importorskip("langchain_core", reason="needs langchain-core (extra 'langchain')")
    from langchain_speculative import ChatSpeculative

    return ChatSpeculative(backend=local, temperature=0, max_tokens=64)


def test_create_agent_runs_the_tool_and_answers(chat: Any) -> None:
    agents = pytest.importorskip("langchain.agents", reason="needs langchain (extra 'langchain')")
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    from langchain_speculative import get_spec_stats_callback

    agent = agents.create_agent(chat, tools=[tool(add)])
    with get_spec_stats_callback() as spec:
        result = agent.invoke(
            {"messages": [{"role": "user", "content": QUESTION}]}, {"recursion_limit": 8}
        )
    messages = result["messages"]
    calls = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    (first,) = calls[0].tool_calls
    assert first["name"] == "add" and set(first["args"]) == {"a", "b"}
    assert results[0].content == str(first["args"]["a"] + first["args"]["b"])
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert "42" in str(final.content)
    assert_plain_answer(str(final.content))
    assert spec.calls == sum(isinstance(m, AIMessage) for m in messages)
    assert spec.generated_tokens and spec.draft_tokens is not None


def test_create_agent_answer_cut_by_max_tokens_is_plain_text(local: Backend) -> None:
    # A long answer that max_tokens cuts inside the {"answer": "..."} the grammar asks for.
    agents = pytest.importorskip("langchain.agents", reason="needs langchain (extra 'langchain')")
    from langchain_core.messages import AIMessage, AIMessageChunk
    from langchain_core.tools import tool

    from langchain_speculative import ChatSpeculative

    chat = ChatSpeculative(backend=local, temperature=0, max_tokens=40)
    agent = agents.create_agent(
        chat,
        tools=[tool(add)],
        system_prompt="After the tool answers, explain the result in three long sentences.",
    )
    question = {"messages": [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]}
    final = agent.invoke(question, {"recursion_limit": 8})["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert_plain_answer(str(final.content))
    assert "5" in str(final.content)
    pieces = [
        str(message.content)
        for message, _ in agent.stream(question, {"recursion_limit": 8}, stream_mode="messages")
        if isinstance(message, AIMessageChunk) and message.content
    ]
    assert_plain_answer(pieces[-1])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_fills_the_schema(chat: Any, method: str) -> None:
    structured = chat.with_structured_output(City, method=method)
    city = structured.invoke("Extract the city: Lyon is a city in France.")
    assert isinstance(city, City)
    assert city.name and city.country


# ---- LlamaIndex ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(local: Backend) -> Any:
    pytest.importorskip("llama_index.core", reason="needs llama-index-core (extra 'llama-index')")
    from llama_index.llms.speculative import Speculative

    return Speculative(local, max_tokens=64)


def test_the_local_engine_is_a_function_calling_llm(llm: Any) -> None:
    assert llm.metadata.is_function_calling_model


def test_predict_and_call_runs_the_tool_the_model_chose(llm: Any) -> None:
    from llama_index.core.tools import FunctionTool

    result = llm.predict_and_call(
        [FunctionTool.from_defaults(fn=add)], user_msg=QUESTION, tool_required=True
    )
    (output,) = result.sources
    assert output.tool_name == "add" and not output.is_error, output.content
    arguments = output.raw_input["kwargs"]
    assert output.raw_output == arguments["a"] + arguments["b"]


async def test_function_agent_calls_the_tool(llm: Any) -> None:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.tools import FunctionTool

    tool = FunctionTool.from_defaults(fn=add, return_direct=True)
    agent = FunctionAgent(tools=[tool], llm=llm, initial_tool_choice="add")
    handler = agent.run(user_msg=QUESTION)
    results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    output = await handler
    (result,) = results
    assert result.tool_name == "add"
    assert result.tool_output.raw_output == result.tool_kwargs["a"] + result.tool_kwargs["b"]
    assert str(output.response.content) == str(result.tool_output.content)


async def test_function_agent_answers_in_plain_text(llm: Any) -> None:
    from llama_index.core.agent.workflow import AgentStream, FunctionAgent
    from llama_index.core.tools import FunctionTool

    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=add)], llm=llm)
    handler = agent.run(user_msg=QUESTION, max_iterations=6)
    deltas = [e.delta async for e in handler.stream_events() if isinstance(e, AgentStream)]
    output = await handler
    assert_plain_answer(str(output.response.content))
    assert '"answer"' not in "".join(deltas)


def test_a_call_cut_by_max_tokens_says_so(local: Backend) -> None:
    from llama_index.core.tools import FunctionTool

    from llama_index.llms.speculative import Speculative

    short = Speculative(local, max_tokens=4)
    with pytest.raises(ValueError, match="cut at max_tokens") as caught:
        short.predict_and_call(
            [FunctionTool.from_defaults(fn=add)], user_msg=QUESTION, tool_required=True
        )
    assert "finish reason 'length'" in str(caught.value)


def test_structured_predict_and_as_structured_llm(llm: Any) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate

    city = llm.structured_predict(
        City, PromptTemplate("Extract the city: {text}"), text="Lyon is a city in France."
    )
    assert isinstance(city, City) and city.name and city.country
    response = llm.as_structured_llm(City).chat(
        [ChatMessage(role="user", content="Extract the city: Porto is a city in Portugal.")]
    )
    assert isinstance(response.raw, City)
    assert City.model_validate_json(response.message.content or "") == response.raw
