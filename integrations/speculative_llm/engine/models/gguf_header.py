"""What a GGUF file's header says about the model, read without loading any weight.

The metadata of a GGUF file sits before its tensors (the format:
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), so a model's architecture
and tokenizer are read in pure Python from its first bytes: ``read_gguf_summary`` for
a listing (the vocabulary's size, not its tokens), ``read_gguf_vocabulary`` for a
vocabulary check (every token text). Files that are not readable GGUF headers give None.
Both the engine (the ``auto`` draft model) and the managed llama-server (its draft
check, ``servers.gguf_vocab``) read headers through this module.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "GGUFSummary",
    "GGUFVocabulary",
    "is_gguf_file",
    "read_gguf_summary",
    "read_gguf_vocabulary",
]

_MAGIC = b"GGUF"
# Value types of the GGUF metadata (gguf.md, "gguf_metadata_value_type").
_STRING, _ARRAY = 8, 9
_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTEGER_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
_TOKENS = "tokenizer.ggml.tokens"
_VOCABULARY_KEYS = {
    "tokenizer.ggml.model",
    _TOKENS,
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
}
_SUMMARY_KEYS = {"general.architecture", "general.name", "tokenizer.ggml.model", _TOKENS}
# llama.cpp common/speculative.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE, _CHECK_START_TOKEN_ID.
_MAX_SIZE_DIFFERENCE = 128
_CHECK_START_TOKEN_ID = 5
_READ_ERRORS = (OSError, ValueError, struct.error, MemoryError, OverflowError)


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
        """Why ``draft`` cannot draft for this target in llama.cpp, or None if it can.

        llama.cpp's rule (``common_speculative_are_compatible``): the same tokenizer
        model and special tokens, sizes within 128 tokens, the same texts from id 5 on.
        """
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


@dataclass(frozen=True, slots=True)
class GGUFSummary:
    """A GGUF model in one line: what its header says, tokens not read.

    Attributes:
        architecture: ``general.architecture`` (``llama``, ``gemma3``...), or ``""``.
        name: ``general.name``, or ``""``.
        tokenizer: ``tokenizer.ggml.model`` (``gpt2``, ``llama``...), or ``""``.
        vocab_size: Number of tokens, or None when the header has none.
    """

    architecture: str
    name: str
    tokenizer: str
    vocab_size: int | None

    def describe(self) -> str:
        """``llama, gpt2 tokenizer, 49,152 tokens`` (what is known)."""
        parts = [self.architecture or "unknown architecture"]
        if self.tokenizer:
            parts.append(f"{self.tokenizer} tokenizer")
        if self.vocab_size is not None:
            parts.append(f"{self.vocab_size:,} tokens")
        return ", ".join(parts)


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
            self.skip_array(self.unpack("<I"), self.unpack("<Q"))
        elif kind in _FIXED_SIZES:
            self.handle.seek(_FIXED_SIZES[kind], os.SEEK_CUR)
        else:
            raise ValueError(f"unknown metadata type {kind}")

    def skip_array(self, element: int, count: int) -> None:
        if element in _FIXED_SIZES:
            self.handle.seek(_FIXED_SIZES[element] * count, os.SEEK_CUR)
        else:
            for _ in range(count):
                self.skip_value(element)

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


def _read_keys(path: str | os.PathLike[str], wanted: set[str], *, count_only: str = "") -> Any:
    """The ``wanted`` metadata of a GGUF header (None: not a readable GGUF of version >= 2).

    The array under ``count_only`` is skipped and its length given instead.
    """
    found: dict[str, Any] = {}
    with Path(path).open("rb") as handle:
        if handle.read(4) != _MAGIC:
            return None
        reader = _Reader(handle)
        if reader.unpack("<I") < 2:
            return None
        reader.unpack("<Q")  # tensor count
        for _ in range(reader.unpack("<Q")):
            key, kind = reader.string(), reader.unpack("<I")
            if key == count_only and kind == _ARRAY:
                element, count = reader.unpack("<I"), reader.unpack("<Q")
                reader.skip_array(element, count)
                found[key] = count
            elif key in wanted:
                found[key] = reader.value(kind)
            else:
                reader.skip_value(kind)
            if found.keys() >= wanted:
                break
    return found


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    try:
        with Path(path).open("rb") as handle:
            return handle.read(4) == _MAGIC
    except OSError:
        return False


def read_gguf_vocabulary(path: str | os.PathLike[str]) -> GGUFVocabulary | None:
    """The tokenizer facts of a GGUF file's header, or None when they cannot be read.

    Only the metadata is read (no tensor data). None for a file that is not a GGUF of
    version 2 or later, or has no ``tokenizer.ggml.tokens``.
    """
    try:
        found = _read_keys(path, _VOCABULARY_KEYS)
    except _READ_ERRORS:
        return None
    tokens = found.get(_TOKENS) if found is not None else None
    if not isinstance(tokens, tuple):
        return None
    bos, eos = found.get("tokenizer.ggml.bos_token_id"), found.get("tokenizer.ggml.eos_token_id")
    return GGUFVocabulary(
        model=str(found.get("tokenizer.ggml.model", "")),
        tokens=tokens,
        bos=bos if isinstance(bos, int) else None,
        eos=eos if isinstance(eos, int) else None,
    )


def read_gguf_summary(path: str | os.PathLike[str]) -> GGUFSummary | None:
    """Architecture, name, tokenizer and vocabulary size from a GGUF header, or None.

    The token texts are skipped, not decoded (about 0.04 s for SmolLM2's 49k tokens and
    0.2 s for Gemma 3's 262k, measured once on a shared 2-core machine, noisy). None for
    a file that is not a readable GGUF of version 2 or later.
    """
    try:
        found = _read_keys(path, _SUMMARY_KEYS, count_only=_TOKENS)
    except _READ_ERRORS:
        return None
    if found is None:
        return None
    count = found.get(_TOKENS)
    return GGUFSummary(
        architecture=str(found.get("general.architecture") or ""),
        name=str(found.get("general.name") or ""),
        tokenizer=str(found.get("tokenizer.ggml.model") or ""),
        vocab_size=count if isinstance(count, int) else None,
    )
