"""GGUF files with a header and no tensors: enough for vocabulary checks, written by hand.

The layout follows https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 3):
magic, version, tensor count, metadata count, then typed key/value pairs.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

UINT32, STRING, ARRAY, FLOAT32 = 4, 8, 9, 6


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf_header(
    path: Path,
    tokens: Sequence[str],
    *,
    model: str = "gpt2",
    bos: int = 1,
    eos: int = 2,
    merges: Sequence[str] = ("a b",),
    padding: int = 0,
) -> Path:
    """A GGUF whose metadata holds a tokenizer (and a few other keys to skip over).

    ``padding`` zero bytes follow the header, to stand for a bigger model's weights.
    """
    pairs = [
        _string("general.architecture") + struct.pack("<I", STRING) + _string("llama"),
        _string("llama.rope.freq_base") + struct.pack("<I", FLOAT32) + struct.pack("<f", 1e4),
        _string("tokenizer.ggml.model") + struct.pack("<I", STRING) + _string(model),
        _string("tokenizer.ggml.merges")
        + struct.pack("<IIQ", ARRAY, STRING, len(merges))
        + b"".join(_string(m) for m in merges),
        _string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", ARRAY, STRING, len(tokens))
        + b"".join(_string(t) for t in tokens),
        _string("tokenizer.ggml.bos_token_id") + struct.pack("<II", UINT32, bos),
        _string("tokenizer.ggml.eos_token_id") + struct.pack("<II", UINT32, eos),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + b"".join(pairs)
    path.write_bytes(header + b"\0" * padding)
    return path
