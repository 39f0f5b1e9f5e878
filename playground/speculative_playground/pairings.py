"""Which offered models can draft for which target.

A draft model must share the target's vocabulary (same tokens, same ids). The packaged
models are two families with different vocabularies, so none of them drafts for the
other, and a model is never offered as its own draft (it costs as much as the target:
measured 46 tok/s with SmolLM2 drafting for itself against 110 without). Models an
operator adds (``--model``, ``--draft-model``) are of unknown vocabulary: they are
offered, and the engine checks the vocabularies before loading the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PACKAGED_VOCABULARIES", "draft_candidates", "draft_note"]

PACKAGED_VOCABULARIES: dict[str, str] = {
    "smollm2-135m": "SmolLM2 (49,152 tokens)",
    "gemma3-270m": "Gemma 3 (262,144 tokens)",
}
"""The vocabulary family of each packaged model: only equal families pair."""


def draft_candidates(target: str, offered: Sequence[str]) -> tuple[str, ...]:
    """The offered models that may draft for ``target``, in the order offered.

    Args:
        target: The target model (packaged alias, path or id).
        offered: The models the page offers.

    Returns:
        Never ``target`` itself, nor a packaged model of another vocabulary family
        than a packaged target's; any other model (its vocabulary is checked when
        it loads).
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
        candidates.append(model)
    return tuple(candidates)


def draft_note(target: str, candidates: Sequence[str], *, custom_allowed: bool) -> str:
    """The draft-model picker's hint: what pairs, or why nothing does.

    Args:
        target: The target model.
        candidates: ``draft_candidates`` for it.
        custom_allowed: Whether users may type a model of their own.
    """
    if candidates:
        return "For the draft-model method; same vocabulary as the target."
    name = target.strip()
    why = (
        f"No draft model ships for {name}: the packaged models have different vocabularies."
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
