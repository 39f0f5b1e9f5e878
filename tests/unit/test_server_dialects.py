"""Every server engine is one dialect on the one OpenAI-compatible client.

The checks a server backend makes when it is built live in the client, not in each
engine, so they hold the same way for every server backend of the registry (and for one
added later): a test here is parametrised over ``SERVER_BACKENDS``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

import pytest

from speculative_llm import ConfigError, build_backend, create_backend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMDialect
from speculative_llm.backends.openai_compat import Dialect, OpenAICompatibleBackend, Route
from speculative_llm.backends.registry import SERVER_BACKENDS, backend_factory
from speculative_llm.types import GenerationRequest

URL = "http://127.0.0.1:9"


@pytest.mark.parametrize("value", ["yes", 1, None])
@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_every_server_engine_refuses_a_require_speculation_that_is_not_a_bool(
    name: str, value: object
) -> None:
    message = f"require_speculation must be True or False, got {value!r}."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$") as caught:
        create_backend(name, base_url=URL, require_speculation=value)
    assert caught.value.field == "require_speculation"
    # build_backend (the adapters', the playground's and the CLI's way in) says the same.
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        build_backend(name, base_url=URL, options={"require_speculation": value})


@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_every_server_engine_names_itself_for_an_option_it_does_not_take(name: str) -> None:
    factory = backend_factory(name)
    with pytest.raises(TypeError, match=rf"^{factory.__qualname__}\.__init__\(\) .* 'colour'$"):
        factory(URL, colour="red")


@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_require_speculation_is_taken_only_by_engines_that_can_tell(name: str) -> None:
    factory = backend_factory(name)
    assert isinstance(factory, type) and issubclass(factory, OpenAICompatibleBackend)
    if factory.dialect_type.confirms_speculation:
        with create_backend(name, base_url=URL, require_speculation=True) as backend:
            assert isinstance(backend, OpenAICompatibleBackend)
            assert backend.require_speculation is True
        return
    with pytest.raises(ConfigError, match=r"cannot tell whether .* speculates") as caught:
        create_backend(name, base_url=URL, require_speculation=True)
    assert caught.value.field == "require_speculation"


@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_each_engine_class_takes_its_name_and_hints_from_its_dialect(name: str) -> None:
    factory = backend_factory(name)
    assert isinstance(factory, type) and issubclass(factory, OpenAICompatibleBackend)
    assert factory.name == factory.dialect_type.name == name
    assert factory.hints is factory.dialect_type.hints


def test_a_dialect_is_spoken_only_by_its_own_class() -> None:
    with pytest.raises(ConfigError, match=r"give that dialect a class of its own") as caught:
        OpenAICompatibleBackend(URL, dialect=VLLMDialect())
    assert caught.value.field == "dialect"
    with pytest.raises(ConfigError, match="speaks TGIDialect"):
        TGIBackend(URL, dialect=Dialect())
    with pytest.raises(ConfigError, match="give it to the dialect"):
        OpenAICompatibleBackend(URL, dialect=Dialect(), require_speculation=True)
    with OpenAICompatibleBackend(URL, dialect=Dialect()) as backend:
        assert backend.name == "openai"


def _dialect_of(name: str) -> Dialect:
    factory = backend_factory(name)
    assert isinstance(factory, type) and issubclass(factory, OpenAICompatibleBackend)
    return factory.dialect_type()


NATIVE_ENGINES = [name for name in SERVER_BACKENDS if "native" in _dialect_of(name).routes.values()]


def test_the_engines_with_a_native_route_are_the_ones_we_know() -> None:
    assert set(NATIVE_ENGINES) >= {"llamacpp", "sglang", "tgi"}


@pytest.mark.parametrize("name", NATIVE_ENGINES)
def test_an_engine_with_a_native_route_builds_its_native_body(name: str) -> None:
    dialect = _dialect_of(name)
    request = GenerationRequest(prompt="Hi", max_tokens=4)
    body = dialect.build_body(request, "native", stream=False, model=None, extra_body={})
    assert body == dialect.native_body(request, stream=False, extra_body={})
    assert "Hi" in body.values()  # the prompt, under the engine's own name


def test_a_native_route_without_a_native_body_says_which_hook_is_missing() -> None:
    class NativeOnly(Dialect):
        native_path: ClassVar[str | None] = "/generate"
        routes: ClassVar[Mapping[str, Route]] = {"native": "native"}

    request = GenerationRequest(prompt="Hi", max_tokens=4)
    with pytest.raises(NotImplementedError, match=r"NativeOnly .* override native_body"):
        NativeOnly().build_body(request, "native", stream=False, model=None, extra_body={})
