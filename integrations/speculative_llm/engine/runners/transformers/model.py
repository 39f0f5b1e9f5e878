"""Loading models for the transformers runner: weight dtypes, tokenizers, checkpoints.

Hugging Face ids, checkpoint directories and (dequantised) ``.gguf`` files load with
``AutoModelForCausalLM.from_pretrained``; GGUF files need the ``gguf`` package. The
tokenizer is the model's own, behind the ``Tokenizer`` interface.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

import torch

from speculative_llm.engine.models.sources import PACKAGED_MODELS, ModelSource
from speculative_llm.engine.models.tokenizers import HfTokenizer
from speculative_llm.engine.runners.base import LoadedModel
from speculative_llm.engine.runners.transformers.fast_paths import FastPaths
from speculative_llm.engine.runners.transformers.runner import TransformersRunner
from speculative_llm.errors import ConfigError, MissingDependencyError, ModelNotFoundError

__all__ = [
    "cpu_supports_bf16",
    "export_hf_checkpoint",
    "load_hf_tokenizer",
    "load_transformers_model",
    "resolve_dtype",
]


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """The weight dtype: ``auto`` is float32 on a CPU, bfloat16 on CUDA.

    ``auto`` keeps greedy speculative output identical to greedy decoding: in float32 a
    verify pass rounds as one-token passes do closely enough that argmaxes agree, while
    in bfloat16 (on CPUs that compute it natively, AVX512-BF16/AMX) batched verification
    rounds differently and greedy outputs diverge on some prompts. ``bfloat16`` stays
    available for users who trade that for speed (decoding is memory-bound, so half
    the bytes per weight is faster where the CPU computes bfloat16 natively); on CUDA
    ``auto`` is bfloat16 (float16 on GPUs without bf16).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        kind = torch.device(device).type
        if kind == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    resolved = _DTYPES.get(dtype)
    if resolved is None:
        raise ConfigError(
            f"Unknown dtype {dtype!r}; use 'auto', 'float32', 'bfloat16' or 'float16'.",
            field="dtype",
        )
    return resolved


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError(
            "transformers", "transformers", "The transformers runner"
        ) from error


def _not_found(source: ModelSource, error: Exception) -> ModelNotFoundError:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
    if source.kind == "hub":
        where = (
            "HF_HUB_OFFLINE is set, so only the local Hugging Face cache was searched"
            if offline
            else "the Hugging Face hub could not provide it (no network, or a wrong id)"
        )
        return ModelNotFoundError(
            f"Could not load model {source.name!r}: {where}. Pass a local directory, a .gguf "
            f"file or a packaged alias ({', '.join(PACKAGED_MODELS)}), which need no hub. "
            f"({type(error).__name__}: {error})",
            field="model",
        )
    return ModelNotFoundError(
        f"Could not load model {source.name!r} from {source.location}: "
        f"{type(error).__name__}: {error}",
        field="model",
    )


def _pretrained_arguments(source: ModelSource) -> tuple[str, dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    if source.gguf_file is not None:
        try:
            import gguf  # noqa: F401
        except ImportError as error:
            raise MissingDependencyError(
                "gguf", "transformers", "Loading a .gguf model on the transformers runner"
            ) from error
        kwargs["gguf_file"] = source.gguf_file
    return source.location, kwargs


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids from the generation config, the model config and the tokenizer."""
    ids: set[int] = set()
    sources = (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer)
    for source in sources:
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def load_hf_tokenizer(source: ModelSource, model: Any = None) -> HfTokenizer:
    """Load the tokenizer of a resolved model (no weights).

    Args:
        source: The resolved model.
        model: The loaded model, whose generation config adds end-of-sequence ids.

    Raises:
        ModelNotFoundError: It cannot be loaded.
    """
    _require_transformers()
    from transformers import AutoTokenizer

    location, kwargs = _pretrained_arguments(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
    except (OSError, ValueError, struct.error) as error:  # struct.error: a corrupt GGUF
        raise _not_found(source, error) from error
    return HfTokenizer(tokenizer, _eos_token_ids(model, tokenizer))


def _context_window(model: Any) -> int | None:
    """Longest sequence the model supports (``max_position_embeddings``)."""
    config = model.config.get_text_config()
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def load_transformers_model(
    source: ModelSource,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
    threads: int | None = None,
    fast_paths: str = "auto",
) -> LoadedModel:
    """Load a resolved model and its tokenizer for the transformers runner.

    The fast paths are probed once here and shared by every runner of the model.

    Args:
        source: The resolved model.
        device: Torch device (``cpu``, ``cuda``...).
        dtype: ``auto`` (see ``resolve_dtype``), ``float32``, ``bfloat16`` or ``float16``.
        threads: Threads torch may use (``torch.set_num_threads``; process-wide).
        fast_paths: ``auto`` (every fast path whose probe passes) or ``off``.

    Raises:
        ModelNotFoundError: The name does not resolve to a loadable model.
        MissingDependencyError: transformers (or gguf for .gguf files) is missing.
    """
    _require_transformers()
    from transformers import AutoModelForCausalLM

    if fast_paths not in ("auto", "off"):
        raise ConfigError(
            f"fast_paths must be 'auto' or 'off', got {fast_paths!r}.", field="fast_paths"
        )
    if threads is not None:
        torch.set_num_threads(threads)
    torch_dtype = resolve_dtype(dtype, device)
    location, kwargs = _pretrained_arguments(source)
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as error:
        raise _not_found(source, error) from error
    # GGUF weights are dequantised to float32 whatever dtype was asked: convert.
    model = model.to(device=device, dtype=torch_dtype).eval()
    tokenizer = load_hf_tokenizer(source, model)
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    paths = FastPaths.probe(model, vocab_size, fast_paths)  # type: ignore[arg-type]
    dtype_name = str(torch_dtype).removeprefix("torch.")
    return LoadedModel(
        name=source.name,
        source=source,
        runner_name="transformers",
        model=model,
        tokenizer=tokenizer,
        context_window=_context_window(model),
        description=f"transformers, {source.name}, {dtype_name} on {device}; {paths.describe()}",
        make_runner=lambda: TransformersRunner(model, fast_paths=paths),
        cpu_threads=torch.get_num_threads() if torch.device(device).type == "cpu" else None,
    )


def export_hf_checkpoint(model: Any, out_dir: str | Path, *, tokenizer: Any = None) -> Path:
    """Save a model as a Hugging Face safetensors directory (what vLLM and SGLang load).

    GGUF-loaded models refuse ``save_pretrained`` (they carry a GGUF quantization
    config); such a model is rebuilt from its config without it and its (dequantised)
    weights are copied in.

    Args:
        model: A loaded causal LM (``LoadedModel.model``).
        out_dir: Directory to write (created).
        tokenizer: Saved alongside when given (servers need it).

    Returns:
        ``out_dir`` as a ``Path``.
    """
    from transformers import AutoModelForCausalLM

    target_dir = Path(out_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(target_dir)
    except Exception:  # GGUF-loaded: transformers refuses; rebuild without quantization
        config = model.config.__class__.from_dict(model.config.to_dict())
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        rebuilt = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=model.dtype
        )
        rebuilt.load_state_dict(model.state_dict())
        for leftover in target_dir.iterdir():
            if leftover.is_file():
                leftover.unlink()
            else:
                shutil.rmtree(leftover)
        rebuilt.save_pretrained(target_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(target_dir)
    return target_dir
