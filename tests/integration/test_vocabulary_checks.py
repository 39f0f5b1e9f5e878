"""A draft model of another family is refused from its files, before its weights load.

gemma-3-270m (a SentencePiece vocabulary of 262,144 tokens) cannot draft for
SmolLM2-135M (a GPT-2-style vocabulary of 49,152). Loading gemma's weights took 59 s per
try on two cores, and nothing remembered the answer, so every retry paid it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speculative_llm import GenerationRequest, Message, SpecConfig, VocabularyMismatchError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REQUEST = GenerationRequest(messages=(Message("user", "Say hello"),), max_tokens=4)


def test_the_local_engine_refuses_a_gemma_draft_without_loading_its_weights(
    smollm2_gguf: Path, gemma_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
    from local_runners import require_llama_cpp
    from speculative_llm.backends.local import LocalBackend
    from speculative_llm.engine.drafters import host
    from speculative_llm.engine.drafters import vocabulary as draft_vocabulary

    require_llama_cpp()
    monkeypatch.setattr(
        draft_vocabulary, "_vocabulary_verdicts", {}
    )  # no verdict from earlier tests
    vocabulary_reads: list[str] = []
    weight_loads: list[str] = []
    read_vocabulary = draft_vocabulary.load_vocabulary

    def counting_vocabulary(source: Any, **options: Any) -> Any:
        vocabulary_reads.append(source.name)  # the draft's name, resolved once
        return read_vocabulary(source, **options)

    def no_weights(source: Any, **options: Any) -> Any:
        weight_loads.append(str(source))
        raise AssertionError(f"the draft's weights were loaded: {source}")

    with LocalBackend(str(smollm2_gguf), threads=1) as local:
        monkeypatch.setattr(draft_vocabulary, "load_vocabulary", counting_vocabulary)
        monkeypatch.setattr(host, "load_model", no_weights)  # where drafts load
        spec = SpecConfig(method="draft_model", draft_model=str(gemma_gguf))
        for _ in range(2):  # the retry is answered from the cache
            with pytest.raises(VocabularyMismatchError, match="method='ngram'"):
                local.generate(REQUEST.replace(spec=spec))
    assert weight_loads == []
    assert vocabulary_reads == [str(gemma_gguf)]


def test_a_managed_llama_server_pair_is_refused_before_it_starts(
    smollm2_gguf: Path,
    gemma_gguf: Path,
    server_logs: Path,
    llama_server_binary: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fixture, not ``from conftest import ...``: in the whole suite that name may be
    # tests/unit/conftest.py.
    from speculative_llm.servers import LlamaServer, process

    spawned: list[Any] = []
    monkeypatch.setattr(process, "spawn", lambda *args, **options: spawned.append(args))
    for _ in range(2):
        server = LlamaServer(
            smollm2_gguf, draft_model=gemma_gguf, threads=1, log_path=server_logs / "pair.log"
        )
        with pytest.raises(VocabularyMismatchError, match="'llama' vs 'gpt2'"):
            server.start()
        assert server.pid is None
    assert spawned == []  # no llama-server loaded either model
