"""Whether a draft model may draft for a target: the same vocabulary, checked from files.

The target verifies the draft's token ids directly, so both must share one vocabulary
(same tokens, same ids). The draft's vocabulary is read before its weights load, and each
verdict is remembered per pair of files.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from speculative_llm.engine.models.loading import load_vocabulary
from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.runners.base import LoadedModel
from speculative_llm.errors import VocabularyMismatchError

__all__ = ["check_draft_vocabulary", "check_vocabulary"]


def check_vocabulary(
    target_tokenizer: Tokenizer, draft_tokenizer: Tokenizer, *, target_name: str, draft_name: str
) -> None:
    """Raise ``VocabularyMismatchError`` unless both tokenizers have the same vocabulary.

    The target verifies the draft's token ids directly, so the two models must share one
    vocabulary (same tokens, same ids).
    """
    target_vocab = list(target_tokenizer.vocabulary())
    draft_vocab = list(draft_tokenizer.vocabulary())
    if target_vocab == draft_vocab:
        return
    differing = [
        token for token, other in zip(target_vocab, draft_vocab, strict=False) if token != other
    ][:3] or (target_vocab[len(draft_vocab) :] or draft_vocab[len(target_vocab) :])[:3]
    raise VocabularyMismatchError(
        f"Draft model {draft_name!r} has a different vocabulary from target {target_name!r} "
        f"({len(draft_vocab)} vs {len(target_vocab)} tokens; differing tokens include "
        f"{differing}). Speculative decoding checks the draft's token ids with the target, so "
        "both must use the same tokenizer: pick a smaller model of the target's family (for "
        "example SmolLM2-135M-Instruct for SmolLM2-360M-Instruct), or use method='ngram' "
        "(prompt lookup), which needs no draft model.",
        field="draft_model",
    )


def _identity(source: ModelSource) -> tuple[Any, ...]:
    """What identifies a model's files: path, size and modification time (hub: the id)."""
    if source.kind == "hub":
        return ("hub", source.name)
    path = Path(source.location) / (source.gguf_file or "config.json")
    try:
        stat = path.stat()
    except OSError:
        return (str(path),)
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


_vocabulary_verdicts: dict[tuple[Any, ...], str] = {}
_verdicts_lock = threading.Lock()


def check_draft_vocabulary(target: LoadedModel, draft: ModelSource) -> None:
    """Refuse a draft model whose vocabulary differs from the target's, before its weights load.

    The draft's vocabulary is read from its files alone (a GGUF's header, or the
    tokenizer files), and the verdict is remembered per pair of files, so a retry with
    the same mismatched pair fails at once.

    Args:
        target: The loaded target model.
        draft: Where the draft model loads from (its name resolved once by the caller).

    Raises:
        VocabularyMismatchError: The vocabularies differ.
    """
    key = (target.runner_name, _identity(target.source), _identity(draft))
    with _verdicts_lock:
        verdict = _vocabulary_verdicts.get(key)
    if verdict is None:
        draft_tokenizer = load_vocabulary(draft, runner=target.runner_name)
        try:
            check_vocabulary(
                target.tokenizer, draft_tokenizer, target_name=target.name, draft_name=draft.name
            )
            verdict = ""
        except VocabularyMismatchError as error:
            verdict = str(error)
        with _verdicts_lock:
            _vocabulary_verdicts[key] = verdict
    if verdict:
        raise VocabularyMismatchError(verdict, field="draft_model")
