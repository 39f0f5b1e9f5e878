"""The draft model ``auto`` stands for: picked by the core, among the models the page offers.

The core's rule (``speculative_llm.engine.models.draft_choice``): the smallest GGUF in
the user's model stores or the packaged cache whose vocabulary is the target's,
compared from the GGUF headers. The page picks once per run, before any backend is
lent, so the local engine and the managed llama-server both get the picked model by
name, the run's notes say which and why, and a refusal is worded for the page.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from speculative_llm.errors import VocabularyMismatchError
from speculative_playground.settings import METHOD_LABELS

if TYPE_CHECKING:
    from speculative_llm.engine.models.draft_choice import DraftChoice

__all__ = ["auto_draft_note", "pick_offered_draft"]


def pick_offered_draft(target: str, offered: Collection[str]) -> DraftChoice:
    """The draft ``auto`` picks for ``target`` among the ``offered`` models.

    Args:
        target: The target model, as the pool loads it (an offered name or a path).
        offered: The models the page offers: a model outside them is never picked.

    Raises:
        ConfigError: The target is not a GGUF model (the draft must then be named).
        VocabularyMismatchError: No offered model can draft for it; the message says
            what to do first, then each candidate and why it was refused.
    """
    # The engine loads on first use only: the page imports it when a run picks.
    from speculative_llm.engine.models.draft_choice import draft_candidates, pick_draft_model
    from speculative_llm.engine.models.sources import resolve_model

    source = resolve_model(target)
    candidates = [c for c in draft_candidates() if c.name in offered]
    try:
        return pick_draft_model(source, candidates)
    except VocabularyMismatchError as error:
        # The core's list of candidates, after the advice: the page cuts long messages.
        found = str(error).partition("Candidates: ")[2].partition(". Pull ")[0]
        details = f" Candidates: {found}." if found else ""
        raise VocabularyMismatchError(
            f"Draft model auto found no offered model that can draft for {target}: a draft "
            "must be a smaller GGUF model with the target's vocabulary. Choose "
            f"{METHOD_LABELS['ngram']}, which needs none, or add a smaller model of the "
            "target's family to Ollama, LM Studio or the Hugging Face cache and restart "
            f"the playground.{details}",
            field="draft_model",
        ) from error


def auto_draft_note(choice: DraftChoice) -> str:
    """The run's note on the draft ``auto`` picked: which, and why."""
    return f"Draft model: {choice.name}, picked by auto: {choice.reason}."
