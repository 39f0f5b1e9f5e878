"""``Speculative`` (LlamaIndex LLM) against the local engine on the tiny model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from langchain_scripted import ScriptedBackend, text_script
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.core.types import PydanticProgramMode
from pydantic import BaseModel

from llama_index.llms.speculative import SPEC_STATS_KEY, Speculative
from llamaindex_entry_points import (
    ENTRY_POINTS,
    check_consistent_stats,
    check_stream_convention,
    run_entry_point,
)
from speculative_llm import (
    ConfigError,
    GenerationRequest,
    Message,
    SpecConfig,
    SpecStats,
    UnsupportedFeatureError,
)
from speculative_llm.backends.base import TOOL_CAPABLE_BACKENDS

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

PROMPT = "abcabcabc abcabc"
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def llm(tiny_backend: LocalBackend) -> Speculative:
    return Speculative(backend=tiny_backend, max_tokens=MAX_TOKENS)


def _expected_chat_text(backend: LocalBackend, prompt: str = PROMPT) -> str:
    """What the core backend answers to the same single user message (greedy)."""
    request = GenerationRequest(
        messages=(Message(role="user", content=prompt),), max_tokens=MAX_TOKENS
    )
    return backend.generate(request).text


# ---- the eight entry points ------------------------------------------------------------


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
async def test_entry_point_answers_with_stats_and_usage(
    llm: Speculative, tiny_backend: LocalBackend, entry_point: str
) -> None:
    run = await run_entry_point(llm, entry_point, PROMPT)

    assert run.text == _expected_chat_text(tiny_backend)
    check_consistent_stats(run, backend="local")
    assert run.stats.source == "exact"
    assert run.stats.method == "ngram"
    assert run.stats.num_speculative_tokens == tiny_backend.default_spec.num_speculative_tokens
    assert {token["provenance"] for token in run.tokens} <= {"draft", "target"}
    assert "".join(token["text"] for token in run.tokens) == run.text
    if run.streaming:
        check_stream_convention(run)
        # Only the last response carries the final record and the usage.
        assert all("usage" not in response.raw for response in run.responses[:-1])


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
async def test_call_time_speculative_none_runs_the_baseline(
    llm: Speculative, tiny_backend: LocalBackend, entry_point: str
) -> None:
    run = await run_entry_point(llm, entry_point, PROMPT, speculative="none")

    assert run.stats.method == "none"
    assert run.stats.draft_tokens == 0
    assert run.stats.generated_tokens == run.stats.verify_steps
    assert {token["provenance"] for token in run.tokens} == {"target"}
    # Greedy speculative decoding is exact: the baseline says the same thing.
    assert run.text == _expected_chat_text(tiny_backend)


async def test_call_time_max_tokens_and_stop_reach_the_backend(llm: Speculative) -> None:
    short = await run_entry_point(llm, "complete", PROMPT, max_tokens=5)
    assert short.stats.generated_tokens == 5
    assert short.last.raw["finish_reason"] == "length"

    full = await run_entry_point(llm, "complete", PROMPT)
    stop = full.text[6:8]
    stopped = await run_entry_point(llm, "stream_complete", PROMPT, stop=[stop])
    assert stopped.text == full.text[: full.text.index(stop)]
    assert stopped.last.raw["finish_reason"] == "stop"


async def test_raw_prompt_completion_when_not_a_chat_model(
    tiny_backend: LocalBackend,
) -> None:
    llm = Speculative(backend=tiny_backend, max_tokens=MAX_TOKENS, is_chat_model=False)
    run = await run_entry_point(llm, "complete", PROMPT)

    expected = tiny_backend.generate(GenerationRequest(prompt=PROMPT, max_tokens=MAX_TOKENS))
    assert run.text == expected.text
    assert run.stats.prompt_tokens == expected.stats.prompt_tokens
    assert llm.metadata.is_chat_model is False


async def test_stream_closed_early_frees_the_engine(llm: Speculative) -> None:
    stream = llm.stream_chat([ChatMessage(role="user", content=PROMPT)])
    first = next(stream)
    stream.close()
    assert first.delta

    async_stream = await llm.astream_complete(PROMPT)
    async for _ in async_stream:
        break
    await async_stream.aclose()

    # The engine's lock was released: the next request runs (in time, not forever).
    run = await asyncio.wait_for(run_entry_point(llm, "acomplete", PROMPT), timeout=120)
    assert run.stats.generated_tokens == MAX_TOKENS or run.last.raw["finish_reason"] == "stop"


def test_llm_predict_goes_through_chat(llm: Speculative, tiny_backend: LocalBackend) -> None:
    from llama_index.core.prompts import PromptTemplate

    answer = llm.predict(PromptTemplate("{letters}"), letters=PROMPT)
    assert answer == _expected_chat_text(tiny_backend)


# ---- metadata --------------------------------------------------------------------------


def test_metadata_comes_from_the_backend(llm: Speculative, tiny_backend: LocalBackend) -> None:
    metadata = llm.metadata
    info = tiny_backend.model_info()

    assert metadata.context_window == info.context_window
    assert metadata.num_output == MAX_TOKENS
    assert metadata.is_chat_model is True
    assert metadata.is_function_calling_model is tiny_backend.capabilities.tool_calling
    assert metadata.model_name == tiny_backend.model_name
    assert llm.backend is tiny_backend
    assert llm.backend_name == "local"


def test_metadata_overrides(tiny_backend: LocalBackend) -> None:
    llm = Speculative(backend=tiny_backend, context_window=512)
    assert llm.metadata.context_window == 512
    # Without max_tokens, the output budget is LlamaIndex's default, capped by the backend.
    assert llm.metadata.num_output == min(256, tiny_backend.model_info().max_output_tokens or 256)


def test_created_by_name_with_a_speculative_config(tiny_model_dir: Path) -> None:
    llm = Speculative(
        "local",
        model=str(tiny_model_dir),
        speculative={"method": "ngram", "k": 2, "ngram_max": 2},
        backend_options={"dtype": "float32"},
        max_tokens=8,
    )
    try:
        assert llm.spec_config == SpecConfig(method="ngram", num_speculative_tokens=2, ngram_max=2)
        assert llm.speculative == llm.spec_config.to_dict()
        response = llm.complete(PROMPT)
        stats = SpecStats.from_dict(response.additional_kwargs[SPEC_STATS_KEY])
        assert stats.num_speculative_tokens == 2
        assert stats.drafted_per_position is None or len(stats.drafted_per_position) <= 2
    finally:
        llm.close()
    assert "backend_options" not in llm.to_dict()


def test_to_dict_and_from_dict_round_trip(tiny_model_dir: Path) -> None:
    llm = Speculative(
        "local",
        model=str(tiny_model_dir),
        speculative={"method": "ngram", "k": 2},
        max_tokens=8,
        stop=["\n"],
    )
    copies = [Speculative.from_dict(llm.to_dict()), Speculative.from_json(llm.to_json())]
    try:
        for copy in copies:
            assert copy.backend_name == "local" and copy.model == str(tiny_model_dir)
            assert copy.spec_config == llm.spec_config
            assert (copy.max_tokens, copy.stop) == (8, ["\n"])
            # Greedy: the rebuilt LLM answers exactly as the original.
            assert copy.complete(PROMPT).text == llm.complete(PROMPT).text
    finally:
        for each in (llm, *copies):
            each.close()


def test_backend_and_backend_name_must_agree(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="disagree") as caught:
        Speculative(backend="llamacpp", backend_name="local", model=str(tiny_model_dir))
    assert caught.value.field == "backend"


def test_backend_passed_in_stays_open(tiny_backend: LocalBackend) -> None:
    llm = Speculative(backend=tiny_backend, max_tokens=2)
    llm.close()
    assert tiny_backend.generate(GenerationRequest(prompt=PROMPT, max_tokens=2)).text


# ---- bad configuration fails at construction -------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative": {"methd": "ngram"}}, "Did you mean 'method'"),
        ({"speculative": "medusa"}, "Unknown speculative method 'medusa'"),
        ({"speculative": {"method": "ngram", "k": 0}}, "num_speculative_tokens must be >= 1"),
        ({"speculative": {"method": "draft_model"}}, "needs draft_model"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be > 0"),
        ({"top_p": 0.0}, "top_p must lie in"),
        ({"context_window": 0}, "context_window must be a positive integer"),
        ({"stop": [""]}, "stop strings must not be empty"),
        ({"backend": "lamacpp"}, "Did you mean 'llamacpp'"),
        ({"backend": 42}, "backend must be a backend name or a Backend instance"),
    ],
)
def test_bad_config_fails_at_construction(options: dict[str, object], message: str) -> None:
    # No model is loaded: every one of these fails before a backend is built.
    options = {"backend": "local", "model": "never-loaded", **options}
    with pytest.raises(ConfigError, match=message):
        Speculative(**options)  # type: ignore[arg-type]


def test_method_the_backend_lacks_fails_at_construction(tiny_backend: LocalBackend) -> None:
    with pytest.raises(UnsupportedFeatureError, match="does not support speculative method 'mtp'"):
        Speculative(backend=tiny_backend, speculative="mtp")


def test_backend_instance_with_backend_options_is_refused(tiny_backend: LocalBackend) -> None:
    with pytest.raises(ConfigError, match="configure the instance itself"):
        Speculative(backend=tiny_backend, backend_options={"dtype": "float32"})
    with pytest.raises(ConfigError, match="configure the instance itself"):
        Speculative(backend=tiny_backend, base_url="http://127.0.0.1:9")


def test_model_with_a_backend_instance_is_the_model_sent_with_each_request(
    tiny_backend: LocalBackend,
) -> None:
    # As with LangChain's ChatSpeculative: the instance serves, model names what to ask for.
    llm = Speculative(backend=tiny_backend, model="served-name", max_tokens=2)
    assert llm._request(messages=None, prompt=PROMPT, kwargs={}).model == "served-name"


def test_values_of_the_wrong_type_are_a_config_error(tiny_backend: LocalBackend) -> None:
    with pytest.raises(ConfigError, match="temperature must be a number") as caught:
        Speculative(backend=tiny_backend, temperature="hot")  # type: ignore[arg-type]
    assert caught.value.field == "temperature"
    with pytest.raises(ConfigError, match="Invalid is_chat_model for Speculative") as caught:
        Speculative(backend=tiny_backend, is_chat_model="maybe")  # type: ignore[arg-type]
    assert caught.value.field == "is_chat_model"


def test_an_unencodable_prompt_is_a_config_error(llm: Speculative) -> None:
    with pytest.raises(ConfigError, match="position 3"):
        llm.complete("abc\ud800")


def test_bad_call_time_option_names_the_field(llm: Speculative) -> None:
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        llm.complete(PROMPT, temperature=-1.0)
    with pytest.raises(ConfigError, match="Did you mean 'method'"):
        llm.chat([ChatMessage(role="user", content=PROMPT)], speculative={"metod": "none"})


# ---- function calling -----------------------------------------------------------------


def _add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_tools_on_a_backend_without_tool_calling_name_the_backends_that_can() -> None:
    from langchain_scripted import ScriptedBackend, text_script

    llm = Speculative(ScriptedBackend(text_script([[("ok", "target")]], drafted=0)))
    assert llm.metadata.is_function_calling_model is False
    tool = FunctionTool.from_defaults(fn=_add)
    with pytest.raises(UnsupportedFeatureError) as caught:
        llm.chat_with_tools([tool], user_msg="What is 2 + 3?")
    message = str(caught.value)
    assert "'scripted' cannot call tools" in message
    for name in TOOL_CAPABLE_BACKENDS:
        assert name in message
    assert "--jinja" in message


def test_the_local_engine_is_a_function_calling_llm(llm: Speculative) -> None:
    assert llm.metadata.is_function_calling_model is True
    tool = FunctionTool.from_defaults(fn=_add)
    response = llm.chat_with_tools([tool], user_msg="What is 2 + 3?", tool_required=True)
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    if response.raw is not None and response.raw.get("finish_reason") == "length":
        return  # the tiny random model ran out of budget inside the call's JSON
    (selection,) = calls
    assert selection.tool_name == "_add" and set(selection.tool_kwargs) == {"a", "b"}


# ---- a tool-calling backend (llama-server client; nothing is sent in these tests) ---------


@pytest.fixture
def server_llm() -> Speculative:
    return Speculative(backend="llamacpp", base_url="http://127.0.0.1:9", max_tokens=16)


def test_server_backend_refuses_a_method_it_cannot_switch_per_request() -> None:
    with pytest.raises(
        UnsupportedFeatureError, match="does not support speculative method 'ngram'"
    ):
        Speculative(backend="llamacpp", base_url="http://127.0.0.1:9", speculative="ngram")
    llm = Speculative(backend="llamacpp", base_url="http://127.0.0.1:9", speculative="server")
    assert llm.spec_config == SpecConfig(method="server")


def test_prepare_chat_with_tools_maps_tools_and_tool_choice(server_llm: Speculative) -> None:
    tool = FunctionTool.from_defaults(fn=_add)
    history = [ChatMessage(role="system", content="Use tools.")]

    prepared = server_llm._prepare_chat_with_tools(
        [tool], user_msg="What is 2 + 3?", chat_history=history, tool_required=True
    )

    assert prepared["tools"] == [tool.metadata.to_openai_tool(skip_length_check=True)]
    assert prepared["tools"][0]["function"]["name"] == "_add"
    assert prepared["tool_choice"] == "required"
    assert [m.content for m in prepared["messages"]] == ["Use tools.", "What is 2 + 3?"]
    assert len(history) == 1  # the caller's history is not modified

    auto = server_llm._prepare_chat_with_tools([tool], user_msg="Hi")
    assert auto["tool_choice"] == "auto"
    named = server_llm._prepare_chat_with_tools([tool], user_msg="Hi", tool_choice="_add")
    request = server_llm._chat_request(named.pop("messages"), named)
    assert request.tool_choice == "required"
    assert request.tools is not None and len(request.tools) == 1
    no_tools = server_llm._prepare_chat_with_tools([], user_msg="Hi")
    assert no_tools["tools"] is None and no_tools["tool_choice"] is None


# ---- structured output ----------------------------------------------------------------


class _City(BaseModel):
    """A city and its country."""

    name: str
    country: str


def _json_backend(answer: str, *, structured_output: bool = True) -> ScriptedBackend:
    return ScriptedBackend(
        text_script([[(answer, "target")]], drafted=0),
        tool_calling=True,
        structured_output=structured_output,
    )


async def test_structured_predict_asks_for_the_json_schema() -> None:
    backend = _json_backend('{"name": "Lyon", "country": "France"}')
    llm = Speculative(backend=backend, max_tokens=32)
    prompt = PromptTemplate("Extract the city: {text}")

    city = llm.structured_predict(_City, prompt, text="Lyon, France")
    same = await llm.astructured_predict(_City, prompt, text="Lyon, France")
    via_structured_llm = llm.as_structured_llm(_City).chat(
        [ChatMessage(role="user", content="Extract the city: Lyon, France")]
    )

    assert city == same == via_structured_llm.raw == _City(name="Lyon", country="France")
    for request in backend.requests:
        assert request.response_format == {
            "type": "json_schema",
            "json_schema": {"name": "_City", "schema": _City.model_json_schema()},
        }
        assert request.tools is None
    assert backend.requests[0].messages[-1].content == "Extract the city: Lyon, France"


def test_structured_predict_with_an_invalid_answer_says_why() -> None:
    llm = Speculative(backend=_json_backend('{"name": "Lyon"'), max_tokens=32)
    with pytest.raises(ValueError, match="not a valid _City") as caught:
        llm.structured_predict(_City, PromptTemplate("Extract: {text}"), text="Lyon")
    assert '{"name": "Lyon"' in str(caught.value)


def test_function_program_mode_keeps_the_forced_tool_call() -> None:
    backend = _json_backend("", structured_output=True)
    llm = Speculative(backend=backend, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    with pytest.raises(ValueError, match="tool call"):
        llm.structured_predict(_City, PromptTemplate("Extract: {text}"), text="Lyon")
    (request,) = backend.requests
    assert request.response_format is None
    assert request.tool_choice == "required"
    assert request.tools is not None and request.tools[0]["function"]["name"] == "_City"
