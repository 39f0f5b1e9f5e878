import argparse
import asyncio
import importlib
import re
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from speculative_llm import (
    Backend,
    Capabilities,
    Chunk,
    ConfigError,
    GenerationRequest,
    SpecConfig,
    UnsupportedFeatureError,
    available_backends,
    create_backend,
    register_backend,
)
from speculative_llm.backends import base, registry
from speculative_llm.backends.base import iterate_in_thread
from speculative_llm.backends.local import LocalBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.backends.registry import BUILTIN_BACKENDS, BackendEntry
from speculative_llm.cli import build_parser
from speculative_llm.commands import bench as bench_command
from speculative_playground.settings import SERVER_KINDS


class EchoBackend(Backend):
    """A minimal third-party backend: echoes the prompt word by word."""

    name = "echo"

    def __init__(self, suffix: str = "") -> None:
        self.suffix = suffix

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            methods=frozenset({"server"}),
            per_request_stats=False,
            live_stats=False,
            token_provenance=False,
            per_request_toggle=False,
        )

    @property
    def model_name(self) -> str:
        return "echo"

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        self.check_request(request)
        assert request.prompt is not None
        for word in (request.prompt + self.suffix).split():
            yield Chunk(text=word + " ")
        yield Chunk(final=True, finish_reason="stop")

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for chunk in self.stream(request):
            yield chunk


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'vllm'") as caught:
        create_backend("vlm")
    assert "llamacpp" in str(caught.value)


def test_register_and_create_a_third_party_backend() -> None:
    register_backend("echo", EchoBackend)
    assert "echo" in available_backends()
    backend = create_backend("echo", suffix=" !")
    completion = backend.generate(GenerationRequest(prompt="a b"))
    assert completion.text == "a b ! "
    assert completion.stats.source == "unavailable"
    assert completion.stats.backend == "echo"


def test_register_by_import_path() -> None:
    register_backend("echo-path", f"{__name__}:EchoBackend")
    assert isinstance(create_backend("echo-path"), EchoBackend)


def test_check_request_rejects_unsupported_method_and_tools() -> None:
    backend = EchoBackend()
    with pytest.raises(UnsupportedFeatureError, match="second server"):
        backend.generate(GenerationRequest(prompt="a", spec=SpecConfig.baseline()))
    with pytest.raises(UnsupportedFeatureError, match=r"cannot call tools.*llamacpp"):
        backend.generate(GenerationRequest(prompt="a", tools=({"type": "function"},)))
    with pytest.raises(UnsupportedFeatureError, match="response_format"):
        backend.generate(GenerationRequest(prompt="a", response_format={"type": "json_object"}))


async def test_agenerate_accumulates_the_async_stream() -> None:
    completion = await EchoBackend().agenerate(GenerationRequest(prompt="x y z"))
    assert completion.text == "x y z "


async def test_iterate_in_thread_yields_everything_and_propagates_errors() -> None:
    def numbers() -> Iterator[int]:
        yield from range(5)
        raise RuntimeError("boom")

    seen: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        async for number in iterate_in_thread(numbers):
            seen.append(number)
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.timeout(30)
async def test_iterate_in_thread_raises_what_making_the_iterator_raised() -> None:
    # A backend's stream() checks the request before it returns an iterator.
    def refused() -> Iterator[int]:
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        async for _ in iterate_in_thread(refused):
            pass


async def test_iterate_in_thread_closes_the_iterator_on_early_exit() -> None:
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            number = 0
            while True:
                yield number
                number += 1
        finally:
            closed.set()

    async for number in iterate_in_thread(endless):
        if number == 3:
            break
    # the worker closes the generator in its own thread
    assert await asyncio.to_thread(closed.wait, 5.0)


# ---- the registry's table against the backends themselves ---------------------------------

URL = "http://127.0.0.1:9"


def _entry_class(entry: BackendEntry) -> type[Backend]:
    module, _, attribute = entry.factory.partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module), attribute)
    return cls


@pytest.fixture
def builtin_backends(tiny_backend: LocalBackend) -> Iterator[dict[str, Backend]]:
    """One instance of every built-in backend (HTTP ones send nothing)."""
    backends: dict[str, Backend] = {}
    for entry in BUILTIN_BACKENDS:
        if entry.server:
            backends[entry.name] = create_backend(entry.name, base_url=URL)
        else:
            assert isinstance(tiny_backend, _entry_class(entry))
            backends[entry.name] = tiny_backend
    yield backends
    for backend in backends.values():
        if backend is not tiny_backend:
            backend.close()


def test_each_entry_says_what_its_backend_declares(builtin_backends: dict[str, Backend]) -> None:
    for entry in BUILTIN_BACKENDS:
        backend = builtin_backends[entry.name]
        assert type(backend) is _entry_class(entry)
        assert backend.name == entry.name
        assert isinstance(backend, OpenAICompatibleBackend) is entry.server, entry.name
        assert backend.capabilities.tool_calling is entry.tool_calling, entry.name
        assert backend.capabilities.predicted_outputs is entry.predicted_outputs, entry.name


def test_every_derived_list_agrees_with_the_backends(
    builtin_backends: dict[str, Backend],
) -> None:
    servers = {n for n, b in builtin_backends.items() if isinstance(b, OpenAICompatibleBackend)}
    tool_callers = {n for n, b in builtin_backends.items() if b.capabilities.tool_calling}
    assert set(registry.SERVER_BACKENDS) == servers
    assert set(registry.IN_PROCESS_BACKENDS) == set(builtin_backends) - servers
    assert set(registry.TOOL_CAPABLE_BACKENDS) == tool_callers
    predictors = {n for n, b in builtin_backends.items() if b.capabilities.predicted_outputs}
    assert set(registry.PREDICTION_BACKENDS) == predictors
    assert registry.TOOL_CAPABLE_BACKENDS == base.TOOL_CAPABLE_BACKENDS
    assert tuple(SERVER_KINDS) == registry.SERVER_BACKENDS  # the playground's server list
    parser = build_parser()
    for name in servers:  # the CLI's playground reaches every server kind by URL
        assert parser.parse_args(["playground", "--backend", name, "--url", URL]).backend == name
    with pytest.raises(SystemExit):
        parser.parse_args(["playground", "--backend", "nonsense"])


def test_bench_help_lists_every_backend() -> None:
    parser = argparse.ArgumentParser()
    bench_command.add_arguments(parser)
    backend_help = next(action.help for action in parser._actions if action.dest == "backend")
    assert backend_help is not None
    named = set(re.findall(r"[a-z]+", backend_help)) & {e.name for e in BUILTIN_BACKENDS}
    assert named == {entry.name for entry in BUILTIN_BACKENDS}


@pytest.mark.parametrize(("alias", "name"), sorted(registry.BACKEND_ALIASES.items()))
def test_aliases_create_the_backend_they_stand_for(alias: str, name: str) -> None:
    assert registry.resolve_backend_name(alias) == name
    entry = registry.backend_entry(alias)
    assert entry is not None and entry.name == name
    with create_backend(alias, base_url=URL) as backend:
        assert backend.name == name
