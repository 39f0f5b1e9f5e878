"""ChatSpeculative where users compare it with ChatOpenAI and ChatOllama (no sockets).

Server fields this class does not name reach the request body (``model_kwargs`` and
per-call keyword arguments), the in-process engine refuses those it cannot honour, and
per-token provenance is opt-in so that messages kept in checkpoints stay small.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_scripted import ScriptedBackend, text_script

from langchain_speculative import ChatSpeculative, SpeculativeLLM
from speculative_llm import Backend, ConfigError, GenerationRequest, Message
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.errors import UnsupportedFeatureError

STEPS = [[("The", "target")], [(" quick", "draft"), (" fox", "target")]]


def scripted() -> ScriptedBackend:
    return ScriptedBackend(text_script(STEPS, drafted=2))


# ---- server fields: model_kwargs and per-call arguments ------------------------------------


def test_model_kwargs_and_per_call_fields_reach_the_request_in_order() -> None:
    backend = scripted()
    chat = ChatSpeculative(backend=backend, model_kwargs={"min_p": 0.05, "n_probs": 2})
    chat.invoke("hi")
    assert dict(backend.requests[-1].extra) == {"min_p": 0.05, "n_probs": 2}
    # A call's own fields win over model_kwargs, and extra_body over both.
    chat.invoke("hi", min_p=0.1, parallel_tool_calls=False, extra_body={"n_probs": 0})
    assert dict(backend.requests[-1].extra) == {
        "min_p": 0.1,
        "n_probs": 0,
        "parallel_tool_calls": False,
    }
    # Through bind, as ChatOpenAI users write it.
    list(chat.bind(stream_options={"include_usage": True}).stream("hi"))
    assert backend.requests[-1].extra["stream_options"] == {"include_usage": True}
    assert chat._identifying_params["model_kwargs"] == {"min_p": 0.05, "n_probs": 2}


def test_the_text_model_sends_per_call_fields_too() -> None:
    backend = scripted()
    llm = SpeculativeLLM(backend=backend, model_kwargs={"min_p": 0.05})
    llm.invoke("hi", typical_p=0.9)
    assert dict(backend.requests[-1].extra) == {"min_p": 0.05, "typical_p": 0.9}


def test_model_kwargs_naming_a_parameter_of_its_own_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"pass temperature=\.\.\. directly") as error:
        ChatSpeculative(backend=scripted(), model_kwargs={"temperature": 0.3})
    assert error.value.field == "model_kwargs"


def test_an_unknown_constructor_argument_points_to_model_kwargs() -> None:
    with pytest.raises(ConfigError, match=r"'min_p'.*model_kwargs=\{\.\.\.\}") as error:
        ChatSpeculative(backend=scripted(), min_p=0.05)
    assert error.value.field == "min_p"


def test_a_misspelt_call_argument_still_raises_instead_of_reaching_the_server() -> None:
    backend = scripted()
    chat = ChatSpeculative(backend=backend)
    with pytest.raises(ConfigError, match="Did you mean 'max_tokens'"):
        chat.invoke("hi", max_token=5)
    assert backend.requests == []


class RecordingServer(OpenAICompatibleBackend):
    """An OpenAI-compatible backend that keeps the bodies it would send and answers nothing."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", model="served")
        self.sent: list[dict[str, Any]] = []

    def generate(self, request: GenerationRequest) -> Any:
        self.check_request(request)
        self.sent.append(self.build_body(request, stream=False))
        raise RuntimeError("recorded")


def test_a_server_body_carries_the_fields_as_the_anchors_send_them() -> None:
    server = RecordingServer()
    chat = ChatSpeculative(backend=server, model_kwargs={"min_p": 0.05})
    with pytest.raises(RuntimeError, match="recorded"):
        chat.invoke("hi", parallel_tool_calls=False, temperature=0.2)
    (body,) = server.sent
    assert body["min_p"] == 0.05 and body["parallel_tool_calls"] is False
    assert body["temperature"] == 0.2 and body["messages"][-1]["content"] == "hi"


def test_the_local_engine_refuses_fields_it_cannot_honour(tiny_backend: Backend) -> None:
    with pytest.raises(UnsupportedFeatureError, match=r"'min_p'.*takes only cache_prompt"):
        ChatSpeculative(backend=tiny_backend, model_kwargs={"min_p": 0.05})
    chat = ChatSpeculative(backend=tiny_backend, max_tokens=4)
    with pytest.raises(UnsupportedFeatureError, match=r"'parallel_tool_calls'.*server backend"):
        chat.invoke("abcabc", parallel_tool_calls=False)
    # What it does honour passes.
    assert chat.invoke("abcabc", cache_prompt=False).content is not None
    request = GenerationRequest(messages=(Message("user", "abc"),), extra={"typical_p": 0.9})
    with pytest.raises(UnsupportedFeatureError, match="'typical_p'"):
        tiny_backend.generate(request)


# ---- per-token provenance ------------------------------------------------------------------


def test_provenance_is_off_by_default_and_the_stats_stay() -> None:
    chat = ChatSpeculative(backend=scripted())
    message = chat.invoke("hi")
    assert "speculative_tokens" not in message.response_metadata
    assert message.response_metadata["speculative"]["accepted_tokens"] == 1
    full = None
    for chunk in chat.stream("hi"):
        assert "speculative_tokens" not in chunk.response_metadata
        full = chunk if full is None else full + chunk
    assert isinstance(full, AIMessageChunk)
    assert full.response_metadata["speculative"]["accepted_tokens"] == 1
    generation = SpeculativeLLM(backend=scripted()).generate(["hi"]).generations[0][0]
    assert generation.generation_info is not None
    assert "speculative_tokens" not in generation.generation_info
    assert generation.generation_info["speculative"]["accepted_tokens"] == 1


def test_provenance_on_request() -> None:
    chat = ChatSpeculative(backend=scripted(), token_provenance=True)
    tokens = chat.invoke("hi").response_metadata["speculative_tokens"]
    assert [t["provenance"] for t in tokens] == ["target", "draft", "target"]
    streamed = [
        token
        for chunk in chat.stream("hi")
        for token in chunk.response_metadata.get("speculative_tokens", [])
    ]
    assert streamed == tokens
