"""Model loading for the local engine: runner choice, loading, vocabulary checks.

Where a name points (packaged alias, ``.gguf`` file, directory, hub id) is decided by
``model_sources``. GGUF files and packaged aliases run on the llama.cpp runner
(``llama_cpp_model``) by default; directories and hub ids, and GGUF files with
``runner="transformers"`` (dequantised by ``from_pretrained(dir, gguf_file=name)``), on
the transformers runner (``transformers_model``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Literal

from speculative_llm.backends.local.model_sources import (
    PACKAGED_MODELS,
    ModelSource,
    PackagedModel,
    cached_packaged_model_path,
    is_gguf,
    model_cache_dir,
    packaged_model_path,
    resolve_model,
)
from speculative_llm.backends.local.runner import LoadedModel, RunnerName
from speculative_llm.backends.local.tokenizers import Tokenizer
from speculative_llm.errors import (
    BackendError,
    ConfigError,
    MissingDependencyError,
    VocabularyMismatchError,
)

__all__ = [
    "PACKAGED_MODELS",
    "RUNNER_CHOICES",
    "LoadedModel",
    "ModelSource",
    "PackagedModel",
    "RunnerChoice",
    "cached_packaged_model_path",
    "check_draft_vocabulary",
    "check_vocabulary",
    "choose_runner",
    "llama_cpp_available",
    "load_model",
    "load_vocabulary",
    "model_cache_dir",
    "packaged_model_path",
    "resolve_model",
]

logger = logging.getLogger(__name__)


# ---- runners and loading ----------------------------------------------------------------

RunnerChoice = Literal["auto", "llamacpp", "transformers"]
"""``auto``: llama.cpp for GGUF files and packaged aliases on a CPU (when its binding is
installed), transformers for everything else."""

RUNNER_CHOICES: tuple[str, ...] = ("auto", "llamacpp", "transformers")


def llama_cpp_available() -> bool:
    """Whether the llama.cpp runner's binding and library load (logged when not)."""
    from speculative_llm.backends.local import llama_cpp_lib

    try:
        llama_cpp_lib.load()
    except (MissingDependencyError, BackendError) as error:
        logger.warning("The llama.cpp runner is unavailable, using transformers: %s", error)
        return False
    return True


def choose_runner(choice: str, source: ModelSource, device: str) -> RunnerName:
    """The runner for a model: ``choice`` checked against the model, or ``auto`` decided.

    Raises:
        ConfigError: An unknown runner, or ``llamacpp`` for a model it cannot run.
    """
    if choice not in RUNNER_CHOICES:
        raise ConfigError(
            f"Unknown runner {choice!r}; use one of {', '.join(RUNNER_CHOICES)}.", field="runner"
        )
    if choice == "llamacpp":
        if not is_gguf(source):
            raise ConfigError(
                f"runner='llamacpp' loads .gguf files and packaged aliases; {source.name!r} is "
                f"a Hugging Face {'checkpoint directory' if source.kind == 'directory' else 'id'}. "
                "Use runner='transformers' (or 'auto'), or convert the checkpoint to GGUF with "
                "llama.cpp's convert_hf_to_gguf.py.",
                field="runner",
            )
        if device != "cpu":
            raise ConfigError(
                f"The llama.cpp runner runs on the CPU (device={device!r} was asked): use "
                "runner='transformers' for other devices.",
                field="device",
            )
        return "llamacpp"
    if choice == "transformers":
        return "transformers"
    if is_gguf(source) and device == "cpu" and llama_cpp_available():
        return "llamacpp"
    return "transformers"


def load_model(
    name: str,
    *,
    runner: str = "auto",
    device: str = "cpu",
    dtype: str | Any = "auto",
    threads: int | None = None,
    context_window: int | None = None,
    weight_layout: str = "auto",
    fast_paths: str = "auto",
    progress: bool = True,
) -> LoadedModel:
    """Load a model and its tokenizer by name (see the module docstring for names).

    Args:
        name: Packaged alias, ``.gguf`` file, local directory or Hugging Face id.
        runner: ``auto``, ``llamacpp`` or ``transformers`` (see ``RunnerChoice``).
        device: Torch device of the transformers runner (``cpu``, ``cuda``...).
        dtype: Transformers runner: ``auto`` (float32 on a CPU), ``float32``,
            ``bfloat16`` or ``float16``.
        threads: CPU threads (llama.cpp's, or torch's process-wide setting).
        context_window: llama.cpp runner: tokens its cache holds (default: the model's,
            at most 8192).
        weight_layout: llama.cpp runner: ``auto``, ``repacked`` or ``plain``.
        fast_paths: Transformers runner: ``auto`` (the faster kernels whose probe leaves
            the logits unchanged) or ``off``.
        progress: Show download progress for packaged models.

    Raises:
        ModelNotFoundError: The name does not resolve to a loadable model.
        MissingDependencyError: The chosen runner's dependencies are missing.
        ConfigError: An invalid option, or a runner that cannot run this model.
    """
    source = resolve_model(name, progress=progress)
    chosen = choose_runner(runner, source, str(device))
    if chosen == "llamacpp":
        from speculative_llm.backends.local.llama_cpp_model import LlamaCppModel

        if fast_paths != "auto":
            raise ConfigError(
                "fast_paths is an option of the transformers runner; the llama.cpp runner "
                f"loading {name!r} runs llama.cpp's own kernels (use runner='transformers').",
                field="fast_paths",
            )

        assert source.gguf_file is not None
        llama_model = LlamaCppModel(
            Path(source.location) / source.gguf_file,
            name=name,
            threads=threads,
            context_window=context_window,
            weight_layout=weight_layout,  # type: ignore[arg-type]
        )
        return LoadedModel(
            name=name,
            source=source,
            runner_name="llamacpp",
            model=llama_model,
            tokenizer=llama_model.tokenizer,
            context_window=llama_model.context_window,
            description=llama_model.describe(),
            make_runner=llama_model.new_runner,
            release=llama_model.close,
        )
    if context_window is not None or weight_layout != "auto":
        raise ConfigError(
            "context_window and weight_layout are options of the llama.cpp runner; the "
            f"transformers runner loading {name!r} takes the model's own context.",
            field="context_window" if context_window is not None else "weight_layout",
        )
    from speculative_llm.backends.local.transformers_model import load_transformers_model

    return load_transformers_model(
        source, device=device, dtype=dtype, threads=threads, fast_paths=fast_paths
    )


def load_vocabulary(name: str, *, runner: RunnerName, progress: bool = True) -> Tokenizer:
    """The tokenizer of a model without its weights (for compatibility checks).

    Raises:
        ModelNotFoundError: The model cannot be found or its vocabulary read.
        ConfigError: The model cannot run on ``runner``.
    """
    source = resolve_model(name, progress=progress)
    if runner == "llamacpp":
        choose_runner("llamacpp", source, "cpu")
        from speculative_llm.backends.local.llama_cpp_model import LlamaCppModel

        assert source.gguf_file is not None
        path = Path(source.location) / source.gguf_file
        return LlamaCppModel(path, name=name, vocab_only=True).tokenizer
    from speculative_llm.backends.local.transformers_model import load_hf_tokenizer

    return load_hf_tokenizer(source)


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


def check_draft_vocabulary(target: LoadedModel, draft_name: str, *, progress: bool = True) -> None:
    """Refuse a draft model whose vocabulary differs from the target's, before its weights load.

    The draft's vocabulary is read from its files alone (a GGUF's header, or the
    tokenizer files), and the verdict is remembered per pair of files, so a retry with
    the same mismatched pair fails at once.

    Raises:
        VocabularyMismatchError: The vocabularies differ.
    """
    draft_source = resolve_model(draft_name, progress=progress)
    key = (target.runner_name, _identity(target.source), _identity(draft_source))
    with _verdicts_lock:
        verdict = _vocabulary_verdicts.get(key)
    if verdict is None:
        draft_tokenizer = load_vocabulary(draft_name, runner=target.runner_name, progress=progress)
        try:
            check_vocabulary(
                target.tokenizer, draft_tokenizer, target_name=target.name, draft_name=draft_name
            )
            verdict = ""
        except VocabularyMismatchError as error:
            verdict = str(error)
        with _verdicts_lock:
            _vocabulary_verdicts[key] = verdict
    if verdict:
        raise VocabularyMismatchError(verdict, field="draft_model")
