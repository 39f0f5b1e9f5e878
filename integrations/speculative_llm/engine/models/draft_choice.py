"""``draft_model="auto"``: the smallest GGUF on this machine that can draft for the target.

The candidates are the GGUF models in the user's stores (``stores``) and the packaged
models already in the cache (their F16 variants never: each is heavier than the
packaged model it is made from, which is then a candidate too). A candidate drafts for
the target when it is a different, smaller file with the very same vocabulary: the same
tokenizer and the same token texts by id, compared from the two GGUF headers
(``gguf_header``) without loading any weight. The smallest such file is picked; when
none is, the error names every candidate and why it was refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speculative_llm.engine.models.gguf_header import (
    GGUFVocabulary,
    read_gguf_summary,
    read_gguf_vocabulary,
)
from speculative_llm.engine.models.sources import (
    PACKAGED_MODELS,
    ModelSource,
    cached_packaged_model_path,
    is_gguf,
)
from speculative_llm.engine.models.stores import find_stored_models
from speculative_llm.errors import ConfigError, VocabularyMismatchError

__all__ = ["AUTO_DRAFT", "DraftCandidate", "DraftChoice", "draft_candidates", "pick_draft_model"]

AUTO_DRAFT = "auto"
"""The ``draft_model`` value that asks for this choice."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DraftCandidate:
    """A GGUF model that might draft.

    Attributes:
        name: The name that loads it (``ollama:...``, a packaged alias...).
        path: Its GGUF file.
        size: Its size in bytes.
    """

    name: str
    path: Path
    size: int


@dataclass(frozen=True, slots=True)
class DraftChoice:
    """The draft model ``auto`` picked, and why.

    Attributes:
        name: The name that loads it.
        path: Its GGUF file.
        reason: One line on why it was picked, and what was passed over.
    """

    name: str
    path: Path
    reason: str


def draft_candidates() -> list[DraftCandidate]:
    """The user's stored GGUF models, then the packaged models already in the cache."""
    found = [DraftCandidate(m.name, m.path, m.size) for m in find_stored_models()]
    for alias in PACKAGED_MODELS:
        path = cached_packaged_model_path(alias)
        if path is not None:
            found.append(DraftCandidate(alias, path, path.stat().st_size))
    return found


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.{2 if size < 10e6 else 0}f} MB"


def _refusal(
    candidate: DraftCandidate, target: Path, target_size: int, vocabulary: GGUFVocabulary
) -> str | None:
    """Why ``candidate`` cannot draft for the target, or None when it can."""
    if candidate.path.resolve() == target.resolve():
        return "it is the target itself"
    if candidate.size >= target_size:
        return f"not smaller than the target ({_megabytes(candidate.size)})"
    # The token count first: read without decoding a token, it refuses most at once.
    summary = read_gguf_summary(candidate.path)
    if summary is None or summary.vocab_size is None:
        return "its GGUF header gives no vocabulary"
    if summary.vocab_size != len(vocabulary.tokens):
        return f"{summary.vocab_size:,} tokens, the target has {len(vocabulary.tokens):,}"
    theirs = read_gguf_vocabulary(candidate.path)
    if theirs is None:
        return "its GGUF header gives no vocabulary"
    if theirs.model != vocabulary.model:
        return f"tokenizer {theirs.model!r}, the target's is {vocabulary.model!r}"
    for index, (mine, other) in enumerate(zip(vocabulary.tokens, theirs.tokens, strict=True)):
        if mine != other:
            return f"token {index} is {other!r}, {mine!r} in the target"
    return None


def pick_draft_model(
    target: ModelSource, candidates: Sequence[DraftCandidate] | None = None
) -> DraftChoice:
    """The smallest candidate with the target's vocabulary (see the module's rule).

    Args:
        target: Where the target model loads from (a GGUF file).
        candidates: The models to choose from (default ``draft_candidates()``).

    Raises:
        ConfigError: The target is not a GGUF file, or its header has no vocabulary
            (``field="draft_model"``).
        VocabularyMismatchError: No candidate can draft; the message names each one and
            why it was refused.
    """
    if not is_gguf(target) or target.gguf_file is None:
        raise ConfigError(
            f"draft_model='auto' picks a draft from GGUF headers, and target {target.name!r} "
            "is not a GGUF model: name the draft model (a smaller model of the same family).",
            field="draft_model",
        )
    target_path = Path(target.location) / target.gguf_file
    vocabulary = read_gguf_vocabulary(target_path)
    if vocabulary is None:
        raise ConfigError(
            f"draft_model='auto' needs the target's vocabulary, and the header of "
            f"{str(target_path)!r} gives none: name the draft model.",
            field="draft_model",
        )
    target_size = target_path.stat().st_size
    pool = draft_candidates() if candidates is None else list(candidates)
    refused: list[str] = []
    seen: set[Path] = set()
    for candidate in sorted(pool, key=lambda c: c.size):
        if candidate.path.resolve() in seen:
            continue  # one file under two names (a store entry linked to the cache)
        seen.add(candidate.path.resolve())
        reason = _refusal(candidate, target_path, target_size, vocabulary)
        if reason is None:
            passed = f"; passed over: {'; '.join(refused)}" if refused else ""
            choice = DraftChoice(
                candidate.name,
                candidate.path,
                f"{candidate.name} ({_megabytes(candidate.size)}) is the smallest model on this "
                f"machine with {target.name}'s vocabulary ({len(vocabulary.tokens):,} tokens, "
                f"target {_megabytes(target_size)}){passed}",
            )
            logger.info("draft_model='auto': %s", choice.reason)
            return choice
        refused.append(f"{candidate.name}: {reason}")
    where = "; ".join(refused) if refused else "none found (no store models, no cached packages)"
    raise VocabularyMismatchError(
        f"draft_model='auto' found no model on this machine that can draft for "
        f"{target.name!r} ({len(vocabulary.tokens):,} tokens, {_megabytes(target_size)}): a "
        f"draft must be a smaller GGUF with the same vocabulary. Candidates: {where}. Pull a "
        "smaller model of the target's family (into Ollama, LM Studio or the HF cache) and "
        "try again, name the draft model, or use method='ngram', which needs none.",
        field="draft_model",
    )
