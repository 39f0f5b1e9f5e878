"""A draft and a target GGUF compared from their headers, before llama-server loads them.

llama-server loads both models (59 s for gemma3-270m on two cores), then refuses a draft
whose vocabulary differs from the target's and serves without speculation. The
vocabulary sits in the GGUF header's metadata (``tokenizer.ggml.*``), so this module
reads just that (``engine.models.gguf_header``, shared with the local engine) and
applies llama.cpp's own compatibility rule (``common_speculative_are_compatible``): the
same tokenizer model and special tokens, vocabulary sizes within 128 tokens, and the
same token texts from id 5 on. Verdicts are cached per pair of files (path, size,
modification time). ``pick_gguf_draft`` is ``draft_model="auto"`` for a target file: the
engine's choice (``engine.models.draft_choice``), from the same headers.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from speculative_llm.engine.models.draft_choice import DraftChoice, pick_draft_model
from speculative_llm.engine.models.gguf_header import GGUFVocabulary, read_gguf_vocabulary
from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.errors import VocabularyMismatchError

__all__ = ["GGUFVocabulary", "check_gguf_draft", "pick_gguf_draft", "read_gguf_vocabulary"]


_verdicts: dict[tuple[Any, ...], str | None] = {}
_verdicts_lock = threading.Lock()


def _identity(path: Path) -> tuple[Any, ...]:
    try:
        stat = path.stat()
    except OSError:
        return (str(path),)
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def check_gguf_draft(target: Path, draft: Path) -> None:
    """Refuse a draft GGUF that llama.cpp would not let draft for ``target``.

    Decided from the two headers; remembered per pair of files, so a retry is answered
    at once. Files whose headers cannot be read are let through (llama-server decides).

    Raises:
        VocabularyMismatchError: The vocabularies are not compatible.
    """
    key = (_identity(target), _identity(draft))
    with _verdicts_lock:
        known = key in _verdicts
        reason = _verdicts.get(key)
    if not known:
        target_vocab, draft_vocab = read_gguf_vocabulary(target), read_gguf_vocabulary(draft)
        reason = (
            None
            if target_vocab is None or draft_vocab is None
            else target_vocab.differences(draft_vocab)
        )
        with _verdicts_lock:
            _verdicts[key] = reason
    if reason is not None:
        raise VocabularyMismatchError(
            f"The draft model {str(draft)!r} cannot draft for target {str(target)!r}: their "
            f"vocabularies differ ({reason}), so llama-server would load both and serve "
            "WITHOUT speculation. Use a draft model with the target's tokenizer (same model "
            "family), or spec_type='ngram-simple', which needs no draft model.",
            field="draft_model",
        )


def pick_gguf_draft(target: Path, *, target_name: str | None = None) -> DraftChoice:
    """``draft_model="auto"`` for the target GGUF file ``target``.

    The smallest GGUF in the user's stores or the packaged cache with the target's
    vocabulary (``engine.models.draft_choice.pick_draft_model``), and why.

    Args:
        target: The target's GGUF file.
        target_name: The name the user gave the target (default: the file's path), as
            the reason and the error name it.

    Raises:
        ConfigError: The target's header gives no vocabulary (``field="draft_model"``).
        VocabularyMismatchError: No model on this machine can draft for it; the message
            names each candidate and why it was refused.
    """
    name = target_name or str(target)
    return pick_draft_model(ModelSource(name, "gguf", str(target.parent), target.name))
