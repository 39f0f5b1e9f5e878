"""The local engine on gemma-3-270m: sliding-window attention layers and no chat template.

Gemma 3 mixes full-attention layers with sliding-window layers (window 512) whose cache
keeps only the last window of states. A rejected draft must be cropped from those
layers too, which needs transformers' "past recording"; a prompt longer than the window
exercises exactly that path. Greedy output must equal transformers' own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="loading a .gguf needs the gguf package")

from speculative_llm import GenerationRequest, Message, SpecConfig  # noqa: E402
from speculative_llm.backends.local import LocalBackend  # noqa: E402

pytestmark = pytest.mark.integration

MAX_TOKENS = 32
FUNCTIONS = "".join(
    f"def scale_{name}(values):\n    return [value * {factor} for value in values]\n\n"
    for factor, name in enumerate(
        [
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
            "thirty",
            "forty",
            "fifty",
        ],
        start=1,
    )
)
PROMPT = FUNCTIONS + "def scale_sixty(values):\n"


@pytest.fixture(scope="module")
def backend(gemma_gguf: Path) -> Iterator[LocalBackend]:
    with LocalBackend(str(gemma_gguf), runner="transformers", dtype="float32", threads=2) as local:
        yield local


def test_prompt_is_longer_than_the_sliding_window(backend: LocalBackend) -> None:
    window = backend.model.config.get_text_config().sliding_window
    prompt_tokens = backend.encode_prompt(GenerationRequest(prompt=PROMPT))
    assert window is not None and len(prompt_tokens) > window


@pytest.mark.parametrize(
    "spec",
    [SpecConfig.baseline(), SpecConfig(method="ngram", num_speculative_tokens=5)],
    ids=["none", "ngram"],
)
def test_greedy_is_token_identical_to_transformers(backend: LocalBackend, spec: SpecConfig) -> None:
    request = GenerationRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, spec=spec)
    prompt = backend.encode_prompt(request)
    eos = sorted(backend.engine.eos_token_ids)
    expected = backend.model.generate(
        torch.tensor([prompt]),
        max_new_tokens=MAX_TOKENS,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )[0, len(prompt) :].tolist()
    completion = backend.generate(request)
    assert [token.id for token in completion.tokens] == expected
    if spec.speculative:
        # The continuation repeats the pattern: drafts are accepted and rejected.
        assert completion.stats.accepted_tokens
        assert completion.stats.rejected_steps


def test_messages_without_a_chat_template_use_a_transcript(backend: LocalBackend) -> None:
    assert not backend.tokenizer.chat_template
    request = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=4)
    text = backend.tokenizer.decode(backend.encode_prompt(request))
    assert text.endswith("User: Say hello.\nAssistant:")
    assert backend.generate(request).stats.generated_tokens >= 1
