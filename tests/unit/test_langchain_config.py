"""Bad configuration fails at construction, with errors that say what to do."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from langchain_scripted import ScriptedBackend, text_script
from pydantic import BaseModel, Field

from langchain_speculative import ChatSpeculative, SpeculativeLLM
from speculative_llm import (
    Chunk,
    ConfigError,
    SpecConfig,
    UnsupportedFeatureError,
    register_backend,
)


def scripted(**capabilities: Any) -> ScriptedBackend:
    return ScriptedBackend(text_script([[("ok", "target")]], drafted=0), **capabilities)


class Person(BaseModel):
    """A person."""

    name: str = Field(description="The name")
    age: int = Field(description="Age in years")


def test_unknown_backend_name_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match=r"Unknown backend 'lokal'\. Did you mean 'local'"):
        ChatSpeculative(backend="lokal")


def test_bad_speculative_dict_fails_before_anything_is_loaded() -> None:
    with pytest.raises(ConfigError, match="Unknown speculative option 'num_spec_tokens'"):
        ChatSpeculative(backend="local", speculative={"method": "ngram", "num_spec_tokens": 5})
    with pytest.raises(ConfigError, match="Unknown speculative method 'ngrams'"):
        SpeculativeLLM(backend=scripted(), speculative="ngrams")
    with pytest.raises(ConfigError, match="needs draft_model"):
        ChatSpeculative(backend=scripted(), speculative={"method": "draft_model"})


def test_method_the_backend_cannot_run_is_refused_at_construction() -> None:
    with pytest.raises(
        ConfigError, match="does not support speculative method 'eagle'; it supports: "
    ):
        ChatSpeculative(backend=scripted(), speculative="eagle")


def test_misspelt_parameter_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"Unknown parameter.*'temprature'.*'temperature'"):
        ChatSpeculative(backend=scripted(), temprature=0.5)


def test_invalid_sampling_values_fail_at_construction() -> None:
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        ChatSpeculative(backend=scripted(), temperature=-1.0)
    with pytest.raises(ConfigError, match="max_tokens must be > 0"):
        SpeculativeLLM(backend=scripted(), max_tokens=0)
    with pytest.raises(ConfigError, match="top_p must lie in"):
        ChatSpeculative(backend=scripted(), top_p=1.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", "hot"), ("max_tokens", "many"), ("top_p", [1]), ("streaming", "maybe")],
)
def test_values_of_the_wrong_type_are_a_config_error(field: str, value: object) -> None:
    # pydantic's ValidationError used to escape instead of the documented ConfigError.
    with pytest.raises(ConfigError, match=f"Invalid {field} for ChatSpeculative") as caught:
        ChatSpeculative(backend=scripted(), **{field: value})
    assert caught.value.field == field


def test_an_unencodable_prompt_fails_before_any_request() -> None:
    chat = ChatSpeculative(backend="llamacpp", base_url="http://127.0.0.1:9")  # no I/O yet
    with pytest.raises(ConfigError, match="position 3"):
        chat.invoke("abc\ud800")


def test_server_backend_needs_base_url() -> None:
    with pytest.raises(ConfigError, match="talks to a server: give base_url"):
        ChatSpeculative(backend="llamacpp")


def test_base_url_with_the_in_process_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match="runs the model in this process"):
        ChatSpeculative(backend="local", base_url="http://127.0.0.1:8080")


def test_backend_options_with_an_instance_are_refused() -> None:
    with pytest.raises(ConfigError, match="configure the instance itself"):
        ChatSpeculative(backend=scripted(), backend_options={"device": "cpu"})


class PickyBackend(ScriptedBackend):
    name = "picky"

    def __init__(self, *, model: str | None = None) -> None:
        super().__init__(text_script([[("ok", "target")]], drafted=0))


def test_options_a_backend_rejects_become_a_config_error() -> None:
    register_backend("picky", PickyBackend)
    with pytest.raises(ConfigError, match="Backend 'picky' rejected its options \\(colour"):
        ChatSpeculative(backend="picky", backend_options={"colour": "red"})


def test_a_named_backend_is_owned_and_closed_an_instance_is_not() -> None:
    register_backend("picky", PickyBackend)
    owned = ChatSpeculative(backend="picky", model="m")
    assert isinstance(owned.client, PickyBackend)
    owned.close()
    assert owned.client.closed

    shared = scripted()
    ChatSpeculative(backend=shared).close()
    assert not shared.closed


def test_api_key_is_secret_and_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULATIVE_LLM_API_KEY", "sk-from-env")
    chat = ChatSpeculative(backend=scripted())
    assert chat.api_key is not None
    assert chat.api_key.get_secret_value() == "sk-from-env"
    assert "sk-from-env" not in repr(chat)


def test_tools_on_a_backend_without_tool_calling_name_one_that_can() -> None:
    chat = ChatSpeculative(backend=scripted())

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    with pytest.raises(UnsupportedFeatureError, match=r"cannot do tool calling.*llamacpp"):
        chat.bind_tools([add])
    with pytest.raises(UnsupportedFeatureError, match="llamacpp"):
        chat.with_structured_output(Person)
    with pytest.raises(UnsupportedFeatureError, match="structured output"):
        chat.with_structured_output(Person, method="json_schema")


def test_tool_only_backend_defaults_to_function_calling_and_refuses_json_schema() -> None:
    chat = ChatSpeculative(backend=scripted(tool_calling=True))
    assert chat.with_structured_output(Person) is not None
    with pytest.raises(UnsupportedFeatureError, match="method='json_schema'"):
        chat.with_structured_output(Person, method="json_schema")
    with pytest.raises(ConfigError, match="Unknown structured output method"):
        chat.with_structured_output(Person, method="xml")  # type: ignore[arg-type]


def test_structured_output_sends_a_json_schema_and_parses_the_answer() -> None:
    answer = '{"name": "Ann", "age": 31}'
    backend = ScriptedBackend(
        [Chunk(text=answer), Chunk(final=True, finish_reason="stop")],
        tool_calling=True,
        structured_output=True,
    )
    chat = ChatSpeculative(backend=backend)
    assert chat.with_structured_output(Person).invoke("who?") == Person(name="Ann", age=31)
    response_format = backend.requests[-1].response_format
    assert response_format is not None
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Person"
    assert response_format["json_schema"]["schema"]["required"] == ["name", "age"]

    raw = chat.with_structured_output(Person.model_json_schema(), include_raw=True).invoke("who?")
    assert isinstance(raw, dict)
    assert raw["parsed"] == {"name": "Ann", "age": 31}
    assert raw["raw"].response_metadata["finish_reason"] == "stop"


def test_profile_reflects_the_backend_capabilities() -> None:
    assert ChatSpeculative(backend=scripted()).profile == {
        "text_inputs": True,
        "text_outputs": True,
        "image_inputs": False,
        "audio_inputs": False,
        "video_inputs": False,
        "pdf_inputs": False,
        "tool_calling": False,
        "tool_choice": False,
        "tool_call_streaming": False,
        "structured_output": False,
        "temperature": True,
    }
    profile = ChatSpeculative(backend=scripted(tool_calling=True)).profile
    assert profile is not None
    assert profile["tool_calling"] is True


def test_identifying_params_name_backend_model_and_spec() -> None:
    chat = ChatSpeculative(backend=scripted(), speculative={"method": "ngram", "k": 3})
    params = chat._identifying_params
    assert params["backend"] == "scripted"
    assert params["model_name"] == "scripted-model"
    assert params["speculative"] == SpecConfig(num_speculative_tokens=3).to_dict()
    assert chat._llm_type == "speculative-chat"
    llm = SpeculativeLLM(backend=scripted(), model="served-name")
    ls = llm._get_ls_params(stop=["x"], model="per-call")
    assert ls == {
        "ls_provider": "speculative",
        "ls_model_name": "per-call",
        "ls_model_type": "llm",
        "ls_stop": ["x"],
    }


def test_missing_langchain_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['langchain_core'] = None\n"
        "try:\n"
        "    import langchain_speculative\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.startswith("MissingDependencyError")
    assert 'pip install "speculative-llm[langchain]"' in result.stdout
