"""Predicted Outputs: a request's prediction is sent where a backend takes it, and counted.

Fixtures: openai/chat_prediction.json (the usage object of OpenAI's Predicted Outputs
guide) and openai/chat_stream_prediction.sse (the same answer streamed).
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_scripted import ScriptedBackend, text_script

from fakeserver import fixture_bytes, fixture_json
from langchain_speculative import ChatSpeculative
from llama_index.llms.speculative import Speculative
from speculative_llm import (
    ConfigError,
    GenerationRequest,
    Message,
    UnsupportedFeatureError,
    create_backend,
)
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.backends.registry import PREDICTION_BACKENDS, SERVER_BACKENDS

URL = "http://127.0.0.1:9"
CODE = fixture_json("openai/chat_prediction.json")["choices"][0]["message"]["content"]
EDIT = GenerationRequest(
    messages=(Message("user", "Replace the username property with an email property."),),
    prediction=CODE.replace("email", "username"),
)


def test_the_prediction_goes_into_the_chat_body() -> None:
    body = OpenAICompatibleBackend(URL).build_body(EDIT, stream=False)
    assert body["prediction"] == {"type": "content", "content": EDIT.prediction}
    assert "prediction" not in OpenAICompatibleBackend(URL).build_body(
        EDIT.replace(prediction=None), stream=False
    )


def test_openais_content_form_is_accepted_and_anything_else_refused() -> None:
    form = {"type": "content", "content": "class User {}"}
    assert EDIT.replace(prediction=form).prediction == "class User {}"
    for bad in ("", {"type": "content"}, {"type": "image", "content": "x"}, 3):
        with pytest.raises(ConfigError, match="prediction must be") as caught:
            EDIT.replace(prediction=bad)
        assert caught.value.field == "prediction"


def test_accepted_and_rejected_prediction_tokens_become_exact_stats() -> None:
    data = fixture_json("openai/chat_prediction.json")
    details = data["usage"]["completion_tokens_details"]
    completion = OpenAICompatibleBackend(URL).parse_response(EDIT, data)
    stats = completion.stats
    assert (stats.source, stats.method) == ("exact", "prediction")
    assert stats.accepted_tokens == details["accepted_prediction_tokens"] == 18
    assert stats.draft_tokens == 18 + 10
    assert stats.acceptance_rate == pytest.approx(18 / 28)
    # 39 completion tokens include the 10 rejected ones, which are not in the answer.
    assert stats.generated_tokens == data["usage"]["completion_tokens"] - 10
    assert stats.prompt_tokens == 81 and completion.text == CODE


def test_without_a_prediction_the_zero_counts_mean_nothing() -> None:
    # OpenAI sends accepted/rejected_prediction_tokens = 0 on every answer.
    data = fixture_json("openai/chat_completion.json")
    stats = OpenAICompatibleBackend(URL).parse_response(EDIT.replace(prediction=None), data).stats
    assert stats.source == "unavailable" and stats.accepted_tokens is None


def test_a_streamed_answer_reports_the_prediction_on_its_last_chunk() -> None:
    body = fixture_bytes("openai/chat_stream_prediction.sse")
    chunks = list(OpenAICompatibleBackend(URL).replay_stream(EDIT, [body[:300], body[300:]]))
    assert "".join(c.text for c in chunks) == CODE
    stats = chunks[-1].stats
    assert stats is not None and chunks[-1].final
    assert (stats.source, stats.accepted_tokens, stats.draft_tokens) == ("exact", 18, 28)


@pytest.mark.parametrize("name", sorted(set(SERVER_BACKENDS) - set(PREDICTION_BACKENDS)))
def test_backends_without_predicted_outputs_refuse_a_prediction(name: str) -> None:
    with create_backend(name, base_url=URL) as backend:
        assert not backend.capabilities.predicted_outputs
        with pytest.raises(UnsupportedFeatureError, match=r"does not send a prediction.*openai"):
            backend.check_request(EDIT)


def test_the_completion_endpoint_refuses_a_prediction() -> None:
    backend = OpenAICompatibleBackend(URL, endpoint="completion")
    with pytest.raises(UnsupportedFeatureError, match="needs a chat request"):
        backend.check_request(GenerationRequest(prompt="class User", prediction=CODE))


def _scripted(**_: Any) -> ScriptedBackend:
    return ScriptedBackend(text_script([[("ok", "target")]], drafted=0))


def test_both_adapters_map_a_per_call_prediction() -> None:
    form = {"type": "content", "content": CODE}
    chat = ChatSpeculative(backend=_scripted())
    request = chat._build_request(messages=list(EDIT.messages or ()), stop=None, prediction=form)
    assert request.prediction == CODE and "prediction" not in request.extra
    llm = Speculative(_scripted())
    request = llm._request(messages=EDIT.messages, prompt=None, kwargs={"prediction": form})
    assert request.prediction == CODE and "prediction" not in request.extra
