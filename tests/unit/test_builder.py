"""build_backend: the one set of rules every adapter builds its backend under."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_scripted import ScriptedBackend, text_script

from speculative_llm import (
    ConfigError,
    MissingDependencyError,
    SpecConfig,
    UnsupportedFeatureError,
    UnsupportedMethodError,
    build_backend,
)
from speculative_llm.backends import registry

URL = "http://127.0.0.1:9"


class RecordingLocal(ScriptedBackend):
    """Stands in for the in-process engine: records the options it was built with."""

    name = "local"

    def __init__(self, **options: Any) -> None:
        super().__init__(text_script([[("ok", "target")]], drafted=0))
        self.options = options


@pytest.fixture
def recorded_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTERED, "local", RecordingLocal)


def test_an_alias_builds_the_backend_it_stands_for() -> None:
    setup = build_backend("llama-server", base_url=URL, api_key="sk-1", timeout=5.0)
    with setup.backend as backend:
        assert backend.name == "llamacpp" and setup.owned
        assert backend.transport.read_timeout == 5.0  # type: ignore[attr-defined]


def test_server_backends_need_a_base_url_and_the_local_one_refuses_it() -> None:
    with pytest.raises(ConfigError, match="talks to a server: give base_url") as caught:
        build_backend("vllm")
    assert caught.value.field == "base_url"
    for given in ({"base_url": URL}, {"options": {"base_url": URL}}):
        with pytest.raises(ConfigError, match="runs the model in this process"):
            build_backend("local", **given)  # type: ignore[arg-type]


@pytest.mark.usefixtures("recorded_local")
def test_local_options_pass_through_unchanged_with_the_spec() -> None:
    spec = SpecConfig(method="ngram", num_speculative_tokens=3)
    setup = build_backend(
        "local",
        model="m",
        speculative=spec,
        api_key="sk-ignored",  # connection options are a server's
        timeout=60.0,
        options={"runner": "llamacpp", "device": "cpu"},
    )
    assert setup.backend.options == {  # type: ignore[attr-defined]
        "model": "m",
        "speculative": spec,
        "runner": "llamacpp",
        "device": "cpu",
    }
    # The engine was given the spec when built; requests need not carry it.
    assert setup.request_spec is None and setup.request_model is None


def test_an_option_given_twice_with_two_values_is_refused() -> None:
    with pytest.raises(ConfigError, match="base_url is given twice") as caught:
        build_backend("openai", base_url=URL, options={"base_url": "http://127.0.0.1:10"})
    assert caught.value.field == "base_url"


def test_an_option_the_backend_does_not_take_is_named() -> None:
    with pytest.raises(ConfigError, match="rejected its options") as caught:
        build_backend("vllm", base_url=URL, options={"colour": "red"})
    assert caught.value.field == "colour"


class Strict(ScriptedBackend):
    """Takes ``model`` and ``depth`` only; its constructor misuses a helper on ``depth=-1``."""

    name = "strict"

    def __init__(self, *, model: str, depth: int = 1) -> None:
        super().__init__(text_script([[("ok", "target")]], drafted=0))
        if depth < 0:
            _paint(colour="red")  # type: ignore[call-arg]  # a TypeError inside it


def _paint() -> None:
    """A helper that takes no keyword (the constructor above calls it wrongly)."""


def test_the_signature_names_the_bad_option_and_a_constructor_typeerror_is_not_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(registry._REGISTERED, "strict", Strict)
    with pytest.raises(ConfigError, match="rejected its options") as caught:
        build_backend("strict", model="m", options={"depht": 2})
    assert caught.value.field == "depht"
    with pytest.raises(ConfigError, match="rejected its options") as caught:
        build_backend("strict", options={"depth": 2})  # model is missing
    assert caught.value.field == "backend_options"
    # A TypeError from inside the constructor names no option the caller gave wrongly.
    with pytest.raises(ConfigError, match="rejected its options") as caught:
        build_backend("strict", model="m", options={"depth": -1})
    assert caught.value.field == "backend_options"


def test_a_missing_dependency_names_the_entry_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def needs_torch(**options: Any) -> None:
        raise ImportError("No module named 'torch'", name="torch")

    monkeypatch.setitem(registry._REGISTERED, "local", needs_torch)
    with pytest.raises(MissingDependencyError, match=r"speculative-llm\[local\]"):
        build_backend("local", model="m")


def test_an_instance_is_adopted_and_model_names_what_to_ask_for() -> None:
    instance = ScriptedBackend(text_script([[("ok", "target")]], drafted=0))
    setup = build_backend(instance, model="served", speculative="ngram", api_key="sk", timeout=1)
    assert setup.backend is instance and not setup.owned
    assert (setup.request_model, setup.request_spec) == ("served", SpecConfig(method="ngram"))
    for given in ({"base_url": URL}, {"options": {"device": "cpu"}}):
        with pytest.raises(ConfigError, match="configure the instance itself"):
            build_backend(instance, **given)  # type: ignore[arg-type]


def test_a_method_the_backend_cannot_run_is_both_error_kinds() -> None:
    with pytest.raises(UnsupportedMethodError) as caught:
        build_backend("llamacpp", base_url=URL, speculative="ngram")
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, UnsupportedFeatureError)
    assert "does not support speculative method 'ngram'; it supports: server" in str(caught.value)


def test_a_backend_built_for_a_method_it_lacks_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[ScriptedBackend] = []

    def scripted(**options: Any) -> ScriptedBackend:
        built.append(ScriptedBackend(text_script([[("ok", "target")]], drafted=0)))
        return built[-1]

    monkeypatch.setitem(registry._REGISTERED, "picky-server", scripted)
    with pytest.raises(UnsupportedMethodError):
        build_backend("picky-server", speculative="eagle")
    assert built[0].closed
