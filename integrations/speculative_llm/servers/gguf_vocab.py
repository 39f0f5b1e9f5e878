"""A draft and a target GGUF compared from their headers, before llama-server loads them.

llama-server loads both models (59 s for gemma3-270m on two cores), then refuses a draft
whose vocabulary differs from the target's and serves without speculation. The
vocabulary sits in the GGUF header's metadata (``tokenizer.ggml.*``), so this module
reads just that, in pure Python (the header format: https://github.com/ggml-org/ggml/
blob/master/docs/gguf.md), and applies llama.cpp's own compatibility rule
(``common_speculative_are_compatible``): the same tokenizer model and special tokens,
vocabulary sizes within 128 tokens, and the same token texts from id 5 on. Verdicts are
cached per pair of files (path, size, modification time).
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from speculative_llm.errors import VocabularyMismatchError

__all__ = ["GGUFVocabulary", "check_gguf_draft", "read_gguf_vocabulary"]

_MAGIC = b"GGUF"
# Value types of the GGUF metadata (gguf.md, "gguf_metadata_value_type").
_STRING, _ARRAY = 8, 9
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTEGER_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
_WANTED = {
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
}
# llama.cpp common/speculative.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE, _CHECK_START_TOKEN_ID.
_MAX_SIZE_DIFFERENCE = 128
_CHECK_START_TOKEN_ID = 5


@dataclass(frozen=True, slots=True)
class GGUFVocabulary:
    """What a GGUF header says about its tokenizer.

    Attributes:
        model: The tokenizer model (``gpt2``, ``llama``...).
        tokens: Token texts by id.
        bos: Beginning-of-sequence id, when given.
        eos: End-of-sequence id, when given.
    """

    model: str
    tokens: tuple[str, ...]
    bos: int | None = None
    eos: int | None = None

    def differences(self, draft: GGUFVocabulary) -> str | None:
        """Why ``draft`` cannot draft for this target in llama.cpp, or None if it can."""
        if self.model != draft.model:
            return f"tokenizer {draft.model!r} vs {self.model!r}"
        for name in ("bos", "eos"):
            mine, theirs = getattr(self, name), getattr(draft, name)
            if mine is not None and theirs is not None and mine != theirs:
                return f"{name.upper()} token {theirs} vs {mine}"
        if abs(len(self.tokens) - len(draft.tokens)) > _MAX_SIZE_DIFFERENCE:
            return f"{len(draft.tokens)} vs {len(self.tokens)} tokens"
        for index in range(_CHECK_START_TOKEN_ID, min(len(self.tokens), len(draft.tokens))):
            if self.tokens[index] != draft.tokens[index]:
                return (
                    f"token {index} is {draft.tokens[index]!r} in the draft, "
                    f"{self.tokens[index]!r} in the target"
                )
        return None


class _Reader:
    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle

    def unpack(self, form: str) -> Any:
        size = struct.calcsize(form)
        data = self.handle.read(size)
        if len(data) != size:
            raise ValueError("the header ends early")
        return struct.unpack(form, data)[0]

    def string(self) -> str:
        length = self.unpack("<Q")
        data = self.handle.read(length)
        if len(data) != length:
            raise ValueError("the header ends early")
        return data.decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind == _STRING:
            self.handle.seek(self.unpack("<Q"), os.SEEK_CUR)
        elif kind == _ARRAY:
            element, count = self.unpack("<I"), self.unpack("<Q")
            if element in _FIXED_SIZES:
                self.handle.seek(_FIXED_SIZES[element] * count, os.SEEK_CUR)
            else:
                for _ in range(count):
                    self.skip_value(element)
        elif kind in _FIXED_SIZES:
            self.handle.seek(_FIXED_SIZES[kind], os.SEEK_CUR)
        else:
            raise ValueError(f"unknown metadata type {kind}")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind in _INTEGER_FORMATS:
            return self.unpack(_INTEGER_FORMATS[kind])
        if kind == _ARRAY:
            element, count = self.unpack("<I"), self.unpack("<Q")
            if element != _STRING:
                raise ValueError("expected an array of strings")
            return tuple(self.string() for _ in range(count))
        self.skip_value(kind)
        return None


def read_gguf_vocabulary(path: str | os.PathLike[str]) -> GGUFVocabulary | None:
    """The tokenizer facts of a GGUF file's header, or None when they cannot be read.

    Only the metadata is read (no tensor data). None for a file that is not a GGUF of
    version 2 or later, or has no ``tokenizer.ggml.tokens``: llama-server then decides.
    """
    found: dict[str, Any] = {}
    try:
        with Path(path).open("rb") as handle:
            if handle.read(4) != _MAGIC:
                return None
            reader = _Reader(handle)
            if reader.unpack("<I") < 2:
                return None
            reader.unpack("<Q")  # tensor count
            for _ in range(reader.unpack("<Q")):
                key, kind = reader.string(), reader.unpack("<I")
                if key in _WANTED:
                    found[key] = reader.value(kind)
                    if found.keys() >= _WANTED:
                        break
                else:
                    reader.skip_value(kind)
    except (OSError, ValueError, struct.error, MemoryError, OverflowError):
        return None
    tokens = found.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, tuple):
        return None
    bos, eos = found.get("tokenizer.ggml.bos_token_id"), found.get("tokenizer.ggml.eos_token_id")
    return GGUFVocabulary(
        model=str(found.get("tokenizer.ggml.model", "")),
        tokens=tokens,
        bos=bos if isinstance(bos, int) else None,
        eos=eos if isinstance(eos, int) else None,
    )


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
