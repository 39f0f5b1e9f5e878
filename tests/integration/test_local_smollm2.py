"""The transformers runner on the real SmolLM2-135M-Instruct (packaged GGUF, dequantised, float32).

Greedy output of every method must be token-identical to transformers'
``generate(do_sample=False)``. Batched verification scores several tokens in one
matrix product, whose float rounding differs from one-token steps; a near-tied argmax
could in principle flip. These tests do not tolerate that silently: a mismatch fails
and its message gives the position and the target's top-2 logit margin there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="loading the SmolLM2 .gguf needs the gguf package")

from local_runners import GREEDY_PROMPTS  # noqa: E402
from speculative_llm import GenerationRequest, Message, SpecConfig  # noqa: E402
from speculative_llm.backends.local import LocalBackend, export_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.integration

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def backend(smollm2_gguf: Path) -> Iterator[LocalBackend]:
    with LocalBackend(
        str(smollm2_gguf), runner="transformers", dtype="float32", threads=2
    ) as local:
        yield local


@pytest.fixture(scope="module")
def draft_backend(smollm2_gguf: Path) -> Iterator[LocalBackend]:
    """SmolLM2 as its own draft: every draft token should be accepted."""
    with LocalBackend(
        str(smollm2_gguf),
        draft_model=str(smollm2_gguf),
        runner="transformers",
        dtype="float32",
        threads=2,
    ) as local:
        yield local


def _request(name: str, spec: SpecConfig | None = None) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", GREEDY_PROMPTS[name]),), max_tokens=MAX_TOKENS, spec=spec
    )


@pytest.fixture(scope="module")
def reference(backend: LocalBackend) -> dict[str, list[int]]:
    """transformers' greedy token ids for every prompt."""
    eos = sorted(backend.engine.eos_token_ids)
    ids: dict[str, list[int]] = {}
    for name in GREEDY_PROMPTS:
        prompt = backend.encode_prompt(_request(name))
        output = backend.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
        ids[name] = output[0, len(prompt) :].tolist()
    return ids


def _explain_mismatch(backend: LocalBackend, name: str, got: list[int], want: list[int]) -> str:
    position = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )
    prompt = backend.encode_prompt(_request(name))
    with torch.inference_mode():
        logits = backend.model(torch.tensor([prompt + want[:position]])).logits[0, -1]
    top = torch.topk(logits.float(), 2)
    margin = float(top.values[0] - top.values[1])
    return (
        f"{name}: first difference at generated token {position} (got "
        f"{got[position : position + 3]}, want {want[position : position + 3]}); target top-2 "
        f"logit margin there {margin:.2e} (a near tie if tiny: batched-verification rounding)"
    )


SPECS = {
    "none": SpecConfig.baseline(),
    # Fixed drafts (cost_aware=False): these tests are about what drafts do.
    "ngram": SpecConfig(method="ngram", num_speculative_tokens=5, cost_aware=False),
    "ngram-k10": SpecConfig(method="ngram", num_speculative_tokens=10, cost_aware=False),
    "ngram-adaptive": SpecConfig(
        method="ngram", num_speculative_tokens=3, adaptive=True, max_speculative_tokens=12
    ),
}


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("prompt_name", list(GREEDY_PROMPTS))
def test_greedy_is_token_identical_to_transformers(
    backend: LocalBackend, reference: dict[str, list[int]], spec_name: str, prompt_name: str
) -> None:
    completion = backend.generate(_request(prompt_name, SPECS[spec_name]))
    got = [token.id for token in completion.tokens]
    want = reference[prompt_name]
    assert got == want, _explain_mismatch(backend, prompt_name, got, want)  # type: ignore[arg-type]
    stats = completion.stats
    assert stats.generated_tokens == len(got)
    if spec_name != "none" and prompt_name == "code_edit":
        # The answer copies the code: prompt lookup must emit more than one token per pass.
        assert stats.accepted_tokens and stats.mean_accepted_length
        assert stats.mean_accepted_length > 1.0


@pytest.mark.parametrize("prompt_name", list(GREEDY_PROMPTS))
def test_draft_model_greedy_is_identical_and_self_draft_is_accepted(
    draft_backend: LocalBackend, reference: dict[str, list[int]], prompt_name: str
) -> None:
    # A fixed k: cost-aware drafting rightly never drafts with a model as dear as its
    # target, and this test is about what the drafts' verification accepts.
    fixed = draft_backend.default_spec.replace(num_speculative_tokens=4, cost_aware=False)
    completion = draft_backend.generate(_request(prompt_name, fixed))
    got = [token.id for token in completion.tokens]
    want = reference[prompt_name]
    assert got == want, _explain_mismatch(draft_backend, prompt_name, got, want)  # type: ignore[arg-type]
    stats = completion.stats
    # The same weights draft and verify: only batched-rounding near-ties could reject.
    assert stats.acceptance_rate is not None and stats.acceptance_rate > 0.9


def test_chat_template_comes_from_the_gguf(backend: LocalBackend) -> None:
    hf_tokenizer = backend.tokenizer.hf_tokenizer  # type: ignore[attr-defined]
    prompt = hf_tokenizer.decode(backend.encode_prompt(_request("free_text")))
    assert "<|im_start|>user" in prompt
    assert prompt.rstrip().endswith("<|im_start|>assistant")


def test_sampling_runs_and_is_reproducible(backend: LocalBackend) -> None:
    request = _request("code_edit", SpecConfig(method="ngram", num_speculative_tokens=5))
    request = request.replace(temperature=0.8, top_p=0.95, seed=7, max_tokens=24)
    first = backend.generate(request)
    assert first.text == backend.generate(request).text
    assert first.stats.generated_tokens == 24 or first.finish_reason == "stop"


def test_export_of_a_gguf_model_round_trips(backend: LocalBackend, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = export_hf_checkpoint(
        backend.model, tmp_path / "smollm2-hf", tokenizer=backend.tokenizer.hf_tokenizer
    )
    assert list(out.glob("*.safetensors"))
    reloaded: Any = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([backend.encode_prompt(_request("free_text"))])
    with torch.inference_mode():
        assert torch.allclose(backend.model(ids).logits, reloaded(ids).logits, atol=1e-4)
