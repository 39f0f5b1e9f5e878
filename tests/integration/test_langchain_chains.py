"""End to end against a real llama-server: an LCEL chain and a tool-calling agent loop.

In both, the callback handler's totals must equal the sum of the statistics carried by
the individual messages. The agent runs in ``tool_calling="json_schema"`` mode: the
packaged SmolLM2-135M cannot produce native tool calls (its template renders no tools;
with one that does, it answers in prose). A forced tool choice calls the tool all the same:
the llamacpp backend sends it in the JSON tool protocol, which
``test_a_forced_choice_calls_the_tool_through_a_tool_template`` checks on a template that
renders tools (tests/integration/test_forced_tool_choice_servers.py on SmolLM2's own).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from langchain_speculative import (
    ChatSpeculative,
    SpecStatsCallbackHandler,
    SpeculativeLLM,
    get_spec_stats_callback,
)
from speculative_llm import SpecStats
from speculative_llm.errors import MissingDependencyError
from speculative_llm.servers import LlamaServer, find_llama_server

pytestmark = pytest.mark.integration

# Copying text is what n-gram drafting is good at: the server proposes draft tokens.
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
COPY_PROMPT = ChatPromptTemplate.from_messages(
    [("system", "You copy code exactly."), ("human", "Copy this code exactly:\n{code}")]
)


def message_stats(messages: list[AIMessage]) -> list[SpecStats]:
    return [SpecStats.from_dict(m.response_metadata["speculative"]) for m in messages]


def assert_totals_match(handler: SpecStatsCallbackHandler, messages: list[AIMessage]) -> None:
    per_message = message_stats(messages)
    assert handler.per_call == per_message
    assert handler.draft_tokens == sum(s.draft_tokens or 0 for s in per_message)
    assert handler.accepted_tokens == sum(s.accepted_tokens or 0 for s in per_message)
    assert handler.generated_tokens == sum(s.generated_tokens or 0 for s in per_message)
    assert handler.total == SpecStats.aggregate(per_message)


@pytest.fixture
def chat(llama_server_ngram: Any) -> ChatSpeculative:
    return ChatSpeculative(
        backend="llamacpp",
        base_url=llama_server_ngram.base_url,
        temperature=0,
        max_tokens=80,
        token_provenance=True,  # the streamed test reads each token's provenance
    )


def tap(seen: list[AIMessage]) -> RunnableLambda[AIMessage, AIMessage]:
    def record(message: AIMessage) -> AIMessage:
        seen.append(message)
        return message

    return RunnableLambda(record)


def test_lcel_chain_reports_server_stats(chat: ChatSpeculative) -> None:
    seen: list[AIMessage] = []
    chain = COPY_PROMPT | chat | tap(seen) | StrOutputParser()
    handler = SpecStatsCallbackHandler()
    text = chain.invoke({"code": CODE}, config={"callbacks": [handler]})
    again = chain.invoke({"code": CODE}, config={"callbacks": [handler]})

    assert text and again
    assert len(seen) == 2
    assert_totals_match(handler, seen)
    total = handler.total
    assert total is not None
    assert total.source == "exact"
    assert total.backend == "llamacpp"
    assert handler.draft_tokens and handler.draft_tokens > 0  # the server did speculate
    assert handler.tokens_per_second and handler.tokens_per_second > 0


async def test_streamed_async_chain_with_the_context_manager(chat: ChatSpeculative) -> None:
    seen: list[AIMessage] = []
    chain = COPY_PROMPT | chat
    with get_spec_stats_callback() as spec:
        full = None
        async for chunk in chain.astream({"code": CODE}):
            full = chunk if full is None else full + chunk
        assert full is not None
        seen.append(full)
        seen.append(await chain.ainvoke({"code": CODE}))
    tokens = full.response_metadata["speculative_tokens"]
    assert "".join(t["text"] for t in tokens) == full.content
    assert (
        sum(t["provenance"] == "draft" for t in tokens)
        == (full.response_metadata["speculative"]["accepted_tokens"])
    )
    assert_totals_match(spec, seen)


def test_text_completion_chain(llama_server_ngram: Any) -> None:
    llm = SpeculativeLLM(
        backend="llamacpp", base_url=llama_server_ngram.base_url, temperature=0, max_tokens=48
    )
    prompt = PromptTemplate.from_template("{code}\n{code}")
    with get_spec_stats_callback() as spec:
        text = (prompt | llm | StrOutputParser()).invoke({"code": CODE})
    assert text
    assert spec.calls == 1
    assert spec.total is not None
    assert spec.total.source == "exact"


@tool
def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return a + b


@pytest.fixture
def agent_chat(llama_server_ngram: Any) -> ChatSpeculative:
    return ChatSpeculative(
        backend="llamacpp",
        base_url=llama_server_ngram.base_url,
        tool_calling="json_schema",
        temperature=0,
        max_tokens=60,
    )


def run_agent(chat: ChatSpeculative, question: str, max_steps: int = 4) -> list[BaseMessage]:
    """A LangGraph-free agent loop: call the model, run the tools it asks for, repeat.

    The first step forces a tool call (a 135M model rarely decides to call one on its
    own); later steps let the model choose, and the last one has no tools.
    """
    tools = {"add": add}
    forced = chat.bind_tools([add], tool_choice="any")
    free = chat.bind_tools([add])
    transcript: list[BaseMessage] = [HumanMessage(question)]
    for step in range(max_steps):
        model = forced if step == 0 else (free if step < max_steps - 1 else chat)
        reply = model.invoke(transcript)
        assert isinstance(reply, AIMessage)
        transcript.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            result = tools[call["name"]].invoke(call)
            assert isinstance(result, ToolMessage)
            transcript.append(result)
    return transcript


def test_tool_calling_agent_loop(agent_chat: ChatSpeculative) -> None:
    with get_spec_stats_callback() as spec:
        transcript = run_agent(agent_chat, "What is 17 + 25? Use the add tool.")

    replies = [m for m in transcript if isinstance(m, AIMessage)]
    tool_results = [m for m in transcript if isinstance(m, ToolMessage)]
    first_call = replies[0].tool_calls[0]
    assert first_call["name"] == "add"
    assert set(first_call["args"]) == {"a", "b"}
    assert tool_results[0].tool_call_id == first_call["id"]
    assert tool_results[0].content == str(first_call["args"]["a"] + first_call["args"]["b"])
    assert isinstance(transcript[-1], AIMessage)
    assert spec.calls == len(replies)
    assert_totals_match(spec, replies)


TOOLS_TEMPLATE = Path(__file__).parent.parent / "fixtures" / "chatml_tools.jinja"


@pytest.fixture(scope="module")
def llama_server_tools_template(smollm2_gguf: Path, tmp_path_factory: Any) -> Iterator[LlamaServer]:
    """llama-server whose chat template renders tools (SmolLM2's own does not)."""
    try:
        find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")
    log = tmp_path_factory.mktemp("server-logs") / "llama-tools-template.log"
    with LlamaServer(
        smollm2_gguf,
        spec_type="ngram-simple",
        extra_args=("--chat-template-file", str(TOOLS_TEMPLATE)),
        log_path=log,
    ) as server:
        yield server


def test_native_tools_reach_the_model_through_the_template(
    llama_server_tools_template: LlamaServer,
) -> None:
    chat = ChatSpeculative(
        backend="llamacpp", base_url=llama_server_tools_template.base_url, max_tokens=4
    )
    plain = chat.invoke("What is 17 + 25?")
    with_tools = chat.bind_tools([add]).invoke("What is 17 + 25?")
    assert plain.usage_metadata is not None and with_tools.usage_metadata is not None
    # The tool's description is in the prompt: the server rendered the tools.
    assert with_tools.usage_metadata["input_tokens"] > plain.usage_metadata["input_tokens"] + 30


def test_a_forced_choice_calls_the_tool_through_a_tool_template(
    llama_server_tools_template: LlamaServer,
) -> None:
    # With this template and tool_choice="required" llama-server let SmolLM2-135M answer
    # in prose until max_tokens (its grammar allows text before the call); the backend
    # now enforces the choice with response_format instead.
    chat = ChatSpeculative(
        backend="llamacpp", base_url=llama_server_tools_template.base_url, max_tokens=64
    )
    reply = chat.bind_tools([add], tool_choice="any").invoke("What is 17 + 25? Use the add tool.")
    (call,) = reply.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}
    assert all(type(value) is int for value in call["args"].values())
