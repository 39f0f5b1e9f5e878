"""LocalBackend with suffix decoding: exact text, the global trie, per-trie statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("transformers", reason="the local engine needs transformers")

from local_runners import RUNNERS, require_llama_cpp  # noqa: E402
from speculative_llm import GenerationRequest, SpecConfig  # noqa: E402
from speculative_llm.backends.local import LocalBackend  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
# Fixed drafts: these tests are about what the tries draft, not whether it pays.
SUFFIX = SpecConfig(method="suffix", num_speculative_tokens=6, cost_aware=False)


@pytest.fixture(scope="module", params=RUNNERS)
def backend(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Any:
    if request.param == "llamacpp":
        require_llama_cpp()
        path: Path = request.getfixturevalue("tiny_gguf")
        local = LocalBackend(str(path), runner="llamacpp", threads=1)
    else:
        local = LocalBackend(str(tiny_model_dir), runner="transformers", dtype="float32")
    yield local
    local.close()


def _request(spec: SpecConfig, prompt: str = PROMPT) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=40, spec=spec)


def test_suffix_text_equals_the_baseline_and_learns_across_requests(
    backend: LocalBackend,
) -> None:
    baseline = backend.generate(_request(SpecConfig.baseline()))
    first = backend.generate(_request(SUFFIX))
    second = backend.generate(_request(SUFFIX))
    assert first.text == second.text == baseline.text
    for completion in (first, second):
        stats = completion.stats
        assert stats.method == "suffix"
        assert stats.request_tree_draft_tokens is not None
        assert stats.global_tree_draft_tokens is not None
        assert stats.request_tree_draft_tokens + stats.global_tree_draft_tokens == (
            stats.draft_tokens
        )
        assert stats.request_tree_accepted_tokens is not None
        assert stats.global_tree_accepted_tokens is not None
        assert stats.request_tree_accepted_tokens + stats.global_tree_accepted_tokens == (
            stats.accepted_tokens
        )
    # The second request's output is the first's: the global trie drafts it.
    assert second.stats.global_tree_accepted_tokens
    assert second.stats.verify_steps is not None and first.stats.verify_steps is not None
    assert second.stats.verify_steps < first.stats.verify_steps
    assert baseline.stats.global_tree_draft_tokens is None  # only suffix decoding has it


def test_without_a_global_trie_only_the_request_drafts(backend: LocalBackend) -> None:
    off = SUFFIX.replace(suffix_cache_tokens=0)
    prompt = "x = [1, 2, 3]\ny = [1, 2, 3]\nz = ["
    for _ in range(2):
        stats = backend.generate(_request(off, prompt)).stats
        assert stats.global_tree_draft_tokens == 0
        assert stats.request_tree_draft_tokens == stats.draft_tokens


def test_the_global_trie_belongs_to_its_backend(backend: LocalBackend) -> None:
    """The global trie is kept by the backend for the drafter, one per (depth, size kept)."""
    backend.generate(_request(SUFFIX.replace(suffix_max_depth=12)))
    key = ("suffix", 12, SUFFIX.suffix_cache_tokens)
    cache = backend.engine.drafter_host.kept(key, lambda: None)
    assert cache is not None and cache.outputs >= 1
    assert "suffix" in backend.capabilities.methods


def test_forget_outputs_empties_the_global_trie(backend: LocalBackend) -> None:
    backend.generate(_request(SUFFIX))
    backend.forget_outputs()
    stats = backend.generate(_request(SUFFIX, "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [")).stats
    assert stats.global_tree_draft_tokens == 0  # nothing remembered from before
