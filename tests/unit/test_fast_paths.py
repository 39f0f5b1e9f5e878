"""The transformers runner's fast paths: one probe per model, on or off, and why."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm import ConfigError, GenerationRequest  # noqa: E402
from speculative_llm.backends.local import LocalBackend  # noqa: E402
from speculative_llm.engine.runners.transformers.fast_paths import FastPaths  # noqa: E402
from tiny_models import load_float32  # noqa: E402

NAMES = ("linears", "head", "attention", "cache")


def test_the_probe_turns_on_every_path_that_keeps_the_logits(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = load_float32(tiny_model_dir)
    with caplog.at_level(logging.INFO, logger="speculative_llm.engine"):
        paths = FastPaths.probe(model, model.config.vocab_size)
    assert tuple(paths.reasons) == NAMES
    assert paths.growing_cache and paths.attention is not None  # the tiny Llama is grouped
    assert "in-place KV cache on" in paths.describe()
    assert any("fast paths:" in record.getMessage() for record in caplog.records)


def test_off_and_bfloat16_say_why(tiny_model_dir: Path) -> None:
    model = load_float32(tiny_model_dir)
    off = FastPaths.probe(model, model.config.vocab_size, "off")
    assert off.names_on == [] and off.linears is None and not off.growing_cache
    assert all("fast_paths='off'" in reason for reason in off.reasons.values())
    half = FastPaths.probe(model.to(torch.bfloat16), model.config.vocab_size)
    assert half.reasons["linears"] == "the model is not float32 on a CPU"
    assert half.reasons["head"] == "the model is not float32 on a CPU"
    only = FastPaths.probe(load_float32(tiny_model_dir), 99, only=frozenset({"cache"}))
    assert only.names_on == ["cache"]
    assert only.reasons["attention"] == "not asked for"
    with pytest.raises(ValueError, match="unknown fast paths"):
        FastPaths.probe(model, 99, only=frozenset({"turbo"}))


def test_off_gives_the_same_greedy_text(tiny_model_dir: Path) -> None:
    request = GenerationRequest(prompt="def add(a, b):\n", max_tokens=24)
    texts = []
    for mode in ("auto", "off"):
        with LocalBackend(str(tiny_model_dir), fast_paths=mode) as backend:
            assert ("fast_paths='off'" in backend.runner_description) == (mode == "off")
            texts.append(backend.generate(request).text)
    assert texts[0] == texts[1]


def test_fast_paths_are_a_transformers_option(tiny_model_dir: Path, tiny_gguf: Path) -> None:
    with pytest.raises(ConfigError, match="fast_paths must be") as caught:
        LocalBackend(str(tiny_model_dir), fast_paths="fast")
    assert caught.value.field == "fast_paths"
    from local_runners import require_llama_cpp

    require_llama_cpp()
    with pytest.raises(ConfigError, match="option of the transformers runner"):
        LocalBackend(str(tiny_gguf), fast_paths="off")


def test_runners_of_one_model_share_its_probe(tiny_model_dir: Path) -> Any:
    with LocalBackend(str(tiny_model_dir), draft_model=str(tiny_model_dir)) as backend:
        backend.generate(GenerationRequest(prompt="x = 1\n", max_tokens=4))
        draft_runner = backend.engine.drafter_host.draft_model(str(tiny_model_dir))[1]
        assert draft_runner.fast_paths is backend.engine.runner.fast_paths  # type: ignore[attr-defined]
