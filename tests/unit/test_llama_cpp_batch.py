"""Several sequences in one llama.cpp context: batched passes against one-sequence passes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="writing tiny GGUF files needs gguf (extra 'transformers')")

from local_runners import require_llama_cpp
from speculative_llm import ConfigError
from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel

PROMPTS = ["def add(a, b):", "hello world, this is", "x = 1\ny = 2\n"]
STEPS = 12


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Iterator[Any]:
    require_llama_cpp()
    # Plain Q8_0 weights: their batched and one-token kernels agree bitwise on this
    # model (conftest's _gguf_of), so a row scored beside other sequences' rows can be
    # compared bitwise with the same row scored alone. Not probed: nothing to choose.
    loaded = LlamaCppModel(
        tiny_gguf, threads=1, weight_layout="plain", probe=False, context_window=256
    )
    yield loaded
    loaded.close()


def _alone(model: Any, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and the logits before each, one sequence in its own context."""
    runner = model.new_runner()
    try:
        rows = [runner.forward(prompt, 1)[0].copy()]
        tokens: list[int] = []
        for _ in range(STEPS):
            tokens.append(int(rows[-1].argmax()))
            rows.append(runner.forward([tokens[-1]], 1)[0].copy())
        return tokens, rows
    finally:
        runner.close()


def test_batched_greedy_passes_score_each_sequence_as_alone(model: Any) -> None:
    prompts = [model.tokenizer.encode(text) for text in PROMPTS]
    references = [_alone(model, prompt) for prompt in prompts]
    batch = model.new_batch_runner(4)
    sequences = batch.sequences[: len(prompts)]
    current = [
        seq.forward(prompt, 1)[0].copy() for seq, prompt in zip(sequences, prompts, strict=True)
    ]
    outputs: list[list[int]] = [[] for _ in prompts]
    for step in range(STEPS):
        for index, (_, rows) in enumerate(references):
            assert np.array_equal(current[index], rows[step]), (index, step)
            outputs[index].append(int(current[index].argmax()))
        logits = batch.forward_rows(
            [(seq, [out[-1]], 1) for seq, out in zip(sequences, outputs, strict=True)]
        )
        current = [rows[0].copy() for rows in logits]
    assert outputs == [tokens for tokens, _ in references]
    assert [seq.length for seq in sequences] == [len(p) + STEPS for p in prompts]


def test_multi_row_verify_passes_split_back_per_sequence(model: Any) -> None:
    prompts = [model.tokenizer.encode(text) for text in PROMPTS]
    references = [_alone(model, prompt) for prompt in prompts]
    batch = model.new_batch_runner(3)
    for seq, prompt in zip(batch.sequences, prompts, strict=True):
        seq.forward(prompt, 1)
    rows = [3, 1, 4]  # drafts of several lengths in one pass
    logits = batch.forward_rows(
        [
            (seq, tokens[:count], count)
            for seq, (tokens, _), count in zip(batch.sequences, references, rows, strict=True)
        ]
    )
    for scored, (_, reference), count in zip(logits, references, rows, strict=True):
        assert scored.shape == (count, model.vocab_size)
        for row in range(count):
            assert np.array_equal(scored[row], reference[row + 1])


def test_rows_out_of_sequence_order_go_to_llama_cpp_in_order_and_come_back_in_theirs(
    model: Any,
) -> None:
    # With a KV stream per sequence llama.cpp splits a batch whose sequences are out of
    # id order into several passes (a scheduler's requests come and go in any order):
    # the runner hands them over in id order and returns each row where it was asked.
    prompts = [model.tokenizer.encode(text) for text in PROMPTS]
    references = [_alone(model, prompt) for prompt in prompts]
    batch = model.new_batch_runner(3)
    for seq, prompt in zip(batch.sequences, prompts, strict=True):
        seq.forward(prompt, 1)
    asked = [2, 0, 1]
    counts = {0: 2, 1: 1, 2: 3}
    logits = batch.forward_rows(
        [(batch.sequences[i], references[i][0][: counts[i]], counts[i]) for i in asked]
    )
    for index, scored in zip(asked, logits, strict=True):
        assert scored.shape == (counts[index], model.vocab_size)
        for row in range(counts[index]):
            assert np.array_equal(scored[row], references[index][1][row + 1])
    sent = [int(batch._arrays.seq_ids[row][0]) for row in range(sum(counts.values()))]
    assert sent == sorted(sent)


def test_a_crop_of_one_sequence_leaves_the_others(model: Any) -> None:
    prompts = [model.tokenizer.encode(text) for text in PROMPTS[:2]]
    (tokens, reference), _ = _alone(model, prompts[0]), None
    batch = model.new_batch_runner(2)
    first, second = batch.sequences
    first.forward(prompts[0], 1)
    second.forward(prompts[1], 1)
    batch.forward_rows([(first, tokens[:4], 4), (second, [7, 8, 9], 1)])
    first.crop(len(prompts[0]) + 1)  # three of its four drafts rejected
    assert second.length == len(prompts[1]) + 3
    (again,) = batch.forward_rows([(first, [tokens[1]], 1)])
    assert np.array_equal(again[0], reference[2])
    assert first.cached_tokens == [*prompts[0], tokens[0], tokens[1]]


def test_bad_batches_are_refused(model: Any) -> None:
    batch = model.new_batch_runner(2)
    first, _ = batch.sequences
    first.forward([1, 2, 3], 1)
    with pytest.raises(ValueError, match="twice"):
        batch.forward_rows([(first, [4], 1), (first, [5], 1)])
    with pytest.raises(ValueError, match="logit rows"):
        batch.forward_rows([(first, [4], 2)])
    with pytest.raises(ConfigError, match="context window"):
        batch.forward_rows([(first, [4] * 254, 1)])
    assert first.length == 3


def test_batching_refuses_zero_sequences_and_bitwise_exactness(model: Any, tiny_gguf: Path) -> None:
    with pytest.raises(ConfigError, match="max_batch must be >= 1"):
        model.new_batch_runner(0)
    bitwise = LlamaCppModel(
        tiny_gguf, threads=1, weight_layout="plain", probe=False, exact="bitwise"
    )
    try:
        with pytest.raises(ConfigError, match="not bitwise exact"):
            bitwise.new_batch_runner(2)
    finally:
        bitwise.close()
