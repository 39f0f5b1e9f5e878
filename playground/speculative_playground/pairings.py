"""Which offered models can draft for which target.

A draft model must share the target's vocabulary (same tokens, same ids). The packaged
models are two families with different vocabularies, so none of them drafts for the
other, and a model is never offered as its own draft (it costs as much as the target:
measured 46 tok/s with SmolLM2 drafting for itself against 110 without). Each family
also has an F16 variant (the same weights in F16, made by llama-quantize): the packaged
model drafts for its F16 variant, never the other way round (F16 decodes one token at
about half the speed: 29.7 against 58.8 tok/s, SmolLM2 on a 2-core AMD EPYC). Models an
operator adds (``--model``, ``--draft-model``) are of unknown vocabulary: they are
offered, and the engine checks the vocabularies before loading the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "HEAVIER_VARIANTS",
    "MODEL_NOTES",
    "PACKAGED_VOCABULARIES",
    "draft_candidates",
    "draft_note",
    "model_note",
]

PACKAGED_VOCABULARIES: dict[str, str] = {
    "smollm2-135m": "SmolLM2 (49,152 tokens)",
    "gemma3-270m": "Gemma 3 (262,144 tokens)",
    "smollm2-135m-f16": "SmolLM2 (49,152 tokens)",
    "gemma3-270m-f16": "Gemma 3 (262,144 tokens)",
}
"""The vocabulary family of each packaged model: only equal families pair."""

HEAVIER_VARIANTS: dict[str, str] = {
    "smollm2-135m-f16": "smollm2-135m",
    "gemma3-270m-f16": "gemma3-270m",
}
"""Variants that cost more per token than the model they are made from: never its draft."""

MODEL_NOTES: dict[str, str] = {
    "smollm2-135m-f16": "F16 weights stand for hardware where speculation pays more: one "
    "more verify row costs ~0.24 of a one-token pass, ~0.53 in Q4_1 (2-core AMD EPYC).",
    "gemma3-270m-f16": "F16 weights stand for hardware where speculation pays more: verify "
    "rows cost less next to a one-token pass than in Q4_K_M (~0.32, 2-core AMD EPYC).",
}
"""One line on what a packaged variant stands for, shown where the page describes models."""


def draft_candidates(target: str, offered: Sequence[str]) -> tuple[str, ...]:
    """The offered models that may draft for ``target``, in the order offered.

    Args:
        target: The target model (packaged alias, path or id).
        offered: The models the page offers.

    Returns:
        Never ``target`` itself, nor a packaged model of another vocabulary family
        than a packaged target's, nor a heavier variant of ``target``; any other model
        (its vocabulary is checked when it loads).
    """
    target = target.strip()
    family = PACKAGED_VOCABULARIES.get(target)
    candidates = []
    for model in dict.fromkeys(offered):
        if model == target:
            continue
        other = PACKAGED_VOCABULARIES.get(model)
        if other is not None and family is not None and other != family:
            continue
        if HEAVIER_VARIANTS.get(model) == target:
            continue
        candidates.append(model)
    return tuple(candidates)


def draft_note(target: str, candidates: Sequence[str], *, custom_allowed: bool) -> str:
    """The draft-model picker's hint: what pairs, or why nothing does.

    Args:
        target: The target model.
        candidates: ``draft_candidates`` for it.
        custom_allowed: Whether users may type a model of their own.
    """
    name = target.strip()
    if candidates:
        return "For the draft-model method; same vocabulary as the target."
    why = (
        f"No draft model ships for {name}: the other packaged models have another "
        "vocabulary or cost more per token."
        if name in PACKAGED_VOCABULARIES
        else f"No offered model is known to share {name}'s vocabulary."
    )
    typed = (
        " Use prompt lookup, or type a smaller model of the same family (for example "
        "SmolLM2-135M for SmolLM2-360M)."
        if custom_allowed
        else " Use prompt lookup."
    )
    return why + typed


def model_note(model: str) -> str:
    """One line on what ``model`` stands for when it is a packaged variant, else ``""``."""
    return MODEL_NOTES.get(model.strip(), "")
