"""``draft_model="auto"``: the smallest GGUF on this machine with the target's vocabulary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gguf_headers import write_gguf_header
from model_stores import add_hf_model, add_ollama_model, isolate_stores, packaged_gguf
from speculative_llm.engine.models.draft_choice import (
    DraftCandidate,
    draft_candidates,
    pick_draft_model,
)
from speculative_llm.engine.models.sources import ModelSource, resolve_model
from speculative_llm.errors import ConfigError, VocabularyMismatchError

TOKENS = [f"t{i}" for i in range(64)]


@pytest.fixture
def packaged() -> dict[str, Path]:
    """The real packaged files (found before the cache is emptied below)."""
    return {
        alias: packaged_gguf(alias) for alias in ("smollm2-135m", "smollm2-135m-f16", "gemma3-270m")
    }


@pytest.fixture
def roots(
    packaged: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Path]:
    # No packaged model in this empty cache: only the stores built here are candidates.
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))
    return isolate_stores(monkeypatch, tmp_path / "stores")


def _gguf(path: Path, tokens: list[str], *, padding: int = 0, model: str = "gpt2") -> Path:
    """A header-only GGUF, padded to stand for a bigger model."""
    write_gguf_header(path, tokens, model=model)
    with path.open("ab") as handle:
        handle.write(b"\0" * padding)
    return path


def _source(path: Path) -> ModelSource:
    return ModelSource(str(path), "gguf", str(path.parent), path.name)


def _candidate(name: str, path: Path) -> DraftCandidate:
    return DraftCandidate(name, path, path.stat().st_size)


def test_the_smallest_model_with_the_same_vocabulary_is_picked(tmp_path: Path) -> None:
    target = _gguf(tmp_path / "target.gguf", TOKENS, padding=10_000)
    small = _gguf(tmp_path / "small.gguf", TOKENS, padding=100)
    smaller = _gguf(tmp_path / "smaller.gguf", TOKENS, padding=10)
    other = _gguf(tmp_path / "other.gguf", [*TOKENS[:5], "x", *TOKENS[6:]])
    choice = pick_draft_model(
        _source(target),
        [_candidate("small", small), _candidate("smaller", smaller), _candidate("other", other)],
    )
    assert (choice.name, choice.path) == ("smaller", smaller)
    assert "smallest" in choice.reason and "other: token 5 is 'x', 't5' in the target" in (
        choice.reason
    )


def test_none_matching_is_refused_naming_each_candidate_and_why(tmp_path: Path) -> None:
    target = _gguf(tmp_path / "target.gguf", TOKENS, padding=1000)
    candidates = [
        _candidate("itself", target),
        _candidate("bigger", _gguf(tmp_path / "big.gguf", TOKENS, padding=5000)),
        _candidate("fewer", _gguf(tmp_path / "few.gguf", TOKENS[:-1])),
        _candidate("llama", _gguf(tmp_path / "llama.gguf", TOKENS, model="llama")),
    ]
    with pytest.raises(VocabularyMismatchError, match="method='ngram'") as caught:
        pick_draft_model(_source(target), candidates)
    message = str(caught.value)
    assert caught.value.field == "draft_model"
    for reason in [
        "itself: it is the target itself",
        "bigger: not smaller than the target",
        "fewer: 63 tokens, the target has 64",
        "llama: tokenizer 'llama', the target's is 'gpt2'",
    ]:
        assert reason in message


def test_a_target_that_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a GGUF model") as caught:
        pick_draft_model(ModelSource("org/model", "hub", "org/model"), [])
    assert caught.value.field == "draft_model"


def test_the_packaged_smollm2_in_a_store_drafts_for_its_f16_variant(
    packaged: dict[str, Path], roots: dict[str, Path]
) -> None:
    smollm2, gemma = packaged["smollm2-135m"], packaged["gemma3-270m"]
    target = packaged["smollm2-135m-f16"]
    add_ollama_model(roots["OLLAMA_MODELS"], "smollm2", smollm2, tag="135m")
    add_hf_model(roots["HF_HUB_CACHE"], "google/gemma-3-270m-GGUF", {"gemma.gguf": gemma})
    assert {c.name for c in draft_candidates()} == {
        "ollama:smollm2:135m",
        "hf:google/gemma-3-270m-GGUF",
    }
    choice = pick_draft_model(_source(target))
    assert choice.name == "ollama:smollm2:135m"
    assert resolve_model(choice.name).gguf_file == choice.path.name


def test_gemma_has_no_draft_among_smollm2_models(
    packaged: dict[str, Path], roots: dict[str, Path]
) -> None:
    smollm2, gemma = packaged["smollm2-135m"], packaged["gemma3-270m"]
    add_ollama_model(roots["OLLAMA_MODELS"], "smollm2", smollm2, tag="135m")
    with pytest.raises(VocabularyMismatchError) as caught:
        pick_draft_model(_source(gemma))
    assert "ollama:smollm2:135m: 49,152 tokens, the target has 262,144" in str(caught.value)


def test_packaged_models_in_the_cache_are_candidates_but_not_their_f16_variants(
    packaged: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_stores(monkeypatch, tmp_path / "stores")
    assert {c.name for c in draft_candidates()} == {"smollm2-135m", "gemma3-270m"}


def test_a_local_backend_drafts_with_the_model_auto_picks(
    tiny_gguf: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from local_runners import require_llama_cpp
    from tiny_models import load_float32, save_tiny_model, tiny_vocabulary, write_gguf

    require_llama_cpp()

    from speculative_llm import GenerationRequest, SpecConfig
    from speculative_llm.backends.local import LocalBackend

    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))
    roots = isolate_stores(monkeypatch, tmp_path / "stores")
    # One layer where the target has two: the same vocabulary in a smaller file.
    source = save_tiny_model(tmp_path / "draft-source", seed=3, hidden_size=64, num_layers=1)
    folder = roots["SPECULATIVE_LLM_LMSTUDIO_MODELS"] / "tests" / "tiny-draft"
    folder.mkdir(parents=True)
    write_gguf(
        folder / "tiny-draft.gguf", load_float32(source), tiny_vocabulary(), quantization="Q8_0"
    )
    spec = SpecConfig(
        method="draft_model", draft_model="auto", num_speculative_tokens=3, cost_aware=False
    )
    with caplog.at_level("INFO"), LocalBackend(str(tiny_gguf), threads=1) as backend:
        completion = backend.generate(GenerationRequest(prompt="abc abc", max_tokens=12, spec=spec))
    assert completion.stats.method == "draft_model" and completion.stats.draft_tokens
    assert re.search(r"lmstudio:tests/tiny-draft \([\d.]+ MB\) is the smallest", caplog.text)
    assert "draft_model='auto': lmstudio:tests/tiny-draft" in capsys.readouterr().err
