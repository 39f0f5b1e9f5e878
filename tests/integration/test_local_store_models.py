"""The local engine on models from the user's stores: an Ollama store built around the
packaged SmolLM2, loaded by its Ollama name, and ``draft_model="auto"`` finding it."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_runners import require_llama_cpp
from model_stores import add_hf_model, add_ollama_model, isolate_stores
from speculative_llm import GenerationRequest, Message, SpecConfig
from speculative_llm.backends.local import LocalBackend

pytestmark = pytest.mark.integration

PROMPT = GenerationRequest(
    messages=(Message("user", "Name three colours of the rainbow."),),
    max_tokens=24,
    spec=SpecConfig(method="none"),
)


@pytest.fixture
def ollama_store(smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    require_llama_cpp()
    roots = isolate_stores(monkeypatch, tmp_path / "stores")
    add_ollama_model(roots["OLLAMA_MODELS"], "smollm2", smollm2_gguf, tag="135m")
    return roots["HF_HUB_CACHE"]


def test_a_local_backend_generates_from_an_ollama_name(
    ollama_store: Path, smollm2_gguf: Path
) -> None:
    with LocalBackend("ollama:smollm2:135m", threads=2) as stored:
        from_store = stored.generate(PROMPT)
    with LocalBackend(str(smollm2_gguf), threads=2) as packaged:
        from_file = packaged.generate(PROMPT)
    assert from_store.text.strip() and from_store.stats.generated_tokens
    # The same file through its Ollama name: the same greedy tokens.
    assert [t.id for t in from_store.tokens] == [t.id for t in from_file.tokens]


def test_auto_picks_the_ollama_model_to_draft_for_its_f16_variant(ollama_store: Path) -> None:
    from speculative_llm.engine.models.sources import derived_model_path

    try:
        f16 = derived_model_path("smollm2-135m-f16", progress=False)
    except Exception as error:  # llama-quantize missing, or the base not fetchable
        pytest.skip(f"smollm2-135m-f16 cannot be made here: {error}")
    add_hf_model(ollama_store, "tests/SmolLM2-135M-F16-GGUF", {f16.name: f16})
    spec = SpecConfig(method="draft_model", draft_model="auto", num_speculative_tokens=3)
    request = GenerationRequest(messages=PROMPT.messages, max_tokens=24, spec=spec)
    with LocalBackend("hf:tests/SmolLM2-135M-F16-GGUF", threads=2, progress=False) as backend:
        completion = backend.generate(request)
        draft, _ = backend.engine.drafter_host.draft_model("auto")
    assert draft.name == "ollama:smollm2:135m"
    assert completion.stats.method == "draft_model" and completion.text.strip()
