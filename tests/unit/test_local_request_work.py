"""LocalBackend does each piece of a request's work once: the tool plan, the statistics,
the resolution of each model name."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from local_runners import ADD_TOOL, RUNNERS, require_llama_cpp  # noqa: E402
from speculative_llm import GenerationRequest, Message, SpecConfig, SpecStats  # noqa: E402
from speculative_llm.backends.local import LocalBackend  # noqa: E402
from speculative_llm.engine.drafters import vocabulary  # noqa: E402
from speculative_llm.engine.loop.request_stats import RequestStats  # noqa: E402
from speculative_llm.engine.models import sources  # noqa: E402
from speculative_llm.engine.request import tools  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"

ADD = ADD_TOOL


@pytest.fixture(scope="module", params=RUNNERS)
def backend(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[LocalBackend]:
    """The tiny target with prompt lookup, k=4, on each runner."""
    if request.param == "llamacpp":
        require_llama_cpp()
        path = request.getfixturevalue("tiny_gguf")
        options: dict[str, Any] = {"threads": 1}
    else:
        path, options = tiny_model_dir, {"dtype": "float32"}
    local = LocalBackend(
        str(path), runner=request.param, speculative={"method": "ngram", "k": 4}, **options
    )
    yield local
    local.close()


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[object]:
    """Replace ``owner.name`` by a wrapper that records each call; the list of calls."""
    calls: list[object] = []
    real = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def test_a_request_with_tools_is_planned_once(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xgrammar", reason="tool calls need xgrammar (extra 'local')")
    # The plan probes whether the chat template renders tools: a template render each time.
    probes = _count_calls(monkeypatch, tools, "template_renders_tools")
    request = GenerationRequest(
        messages=(Message("user", "Add 2 and 3."),),
        max_tokens=8,
        tools=(ADD,),
        tool_choice="required",
    )
    completion = backend.generate(request)
    assert completion.stats.generated_tokens > 0
    assert len(probes) == 1
    probes.clear()
    chunks = list(backend.stream(request))
    assert chunks[-1].final
    assert len(probes) == 1


def _several_steps() -> GenerationRequest:
    return GenerationRequest(prompt=PROMPT, max_tokens=12, spec=SpecConfig(method="none"))


def test_generate_builds_the_statistics_once(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshots = _count_calls(monkeypatch, RequestStats, "snapshot")
    completion = backend.generate(_several_steps())
    assert completion.stats.verify_steps is not None and completion.stats.verify_steps > 1
    assert isinstance(completion.stats, SpecStats) and completion.stats.source == "exact"
    assert len(snapshots) == 1

    snapshots.clear()
    completion = asyncio.run(backend.agenerate(_several_steps()))
    assert completion.stats.verify_steps is not None and completion.stats.verify_steps > 1
    assert len(snapshots) == 1


def test_a_stream_still_carries_live_statistics_on_every_chunk(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshots = _count_calls(monkeypatch, RequestStats, "snapshot")
    chunks = list(backend.stream(_several_steps()))
    assert len(chunks) > 1 and all(chunk.stats is not None for chunk in chunks)
    assert len(snapshots) == len(chunks)
    generated = [chunk.stats.generated_tokens for chunk in chunks if chunk.stats is not None]
    assert generated == sorted(generated) and generated[-1] == 12


def test_generate_gives_what_the_stream_gives(backend: LocalBackend) -> None:
    request = _several_steps().replace(seed=7)
    streamed = list(backend.stream(request))
    completion = backend.generate(request)
    assert completion.text == "".join(chunk.text for chunk in streamed)
    assert completion.tokens == tuple(token for chunk in streamed for token in chunk.tokens)
    assert completion.finish_reason == streamed[-1].finish_reason
    assert completion.usage == streamed[-1].usage
    final = streamed[-1].stats
    assert final is not None
    assert completion.stats.generated_tokens == final.generated_tokens
    assert completion.stats.verify_steps == final.verify_steps


def _count_resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every model name ``resolve_model`` resolves from now on, wherever it was imported."""
    names: list[str] = []
    real = sources.resolve_model

    def counting(name: str, **options: Any) -> Any:
        names.append(name)
        return real(name, **options)

    for name, module in list(sys.modules.items()):
        if name.startswith("speculative_llm") and getattr(module, "resolve_model", None) is real:
            monkeypatch.setattr(module, "resolve_model", counting)
    return names


@pytest.mark.parametrize("runner", RUNNERS)
def test_each_model_name_is_resolved_once_per_request(
    runner: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft model's vocabulary check and its load read one resolution of its name."""
    if runner == "llamacpp":
        require_llama_cpp()
        target, draft = (
            request.getfixturevalue("tiny_gguf"),
            request.getfixturevalue("tiny_draft_gguf"),
        )
        options: dict[str, Any] = {"threads": 1}
    else:
        target, draft = (
            request.getfixturevalue("tiny_model_dir"),
            request.getfixturevalue("tiny_draft_dir"),
        )
        options = {"dtype": "float32"}
    # No verdict remembered from earlier tests: this request reads the draft's vocabulary.
    monkeypatch.setattr(vocabulary, "_vocabulary_verdicts", {})
    resolved = _count_resolutions(monkeypatch)
    with LocalBackend(str(target), runner=runner, calibrate_costs=False, **options) as local:
        assert resolved == [str(target)]
        resolved.clear()
        spec = SpecConfig(method="draft_model", draft_model=str(draft), num_speculative_tokens=3)
        drafted = GenerationRequest(prompt=PROMPT, max_tokens=4, spec=spec)
        assert local.generate(drafted).stats.method == "draft_model"
        assert resolved == [str(draft)]
        resolved.clear()
        local.generate(drafted)  # the draft model is loaded: nothing to resolve
        assert resolved == []
