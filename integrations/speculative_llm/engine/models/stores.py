"""The GGUF models users already have: Ollama's store, LM Studio's folder, the HF cache.

Names with a store's prefix resolve to a GGUF file on this machine, never downloaded:

- ``ollama:NAME[:TAG]``, ``ollama:NAMESPACE/NAME:TAG`` (``HOST/NAMESPACE/NAME:TAG`` for
  other registries; TAG defaults to ``latest``). Ollama's layout, as its source has it
  (ollama/ollama ``envconfig/config.go`` ``Models()``: ``$OLLAMA_MODELS``, else
  ``~/.ollama/models``; ``server/modelpath.go``: the manifest at
  ``manifests/HOST/NAMESPACE/NAME/TAG``, host ``registry.ollama.ai`` and namespace
  ``library`` by default, and ``GetBlobsPath``, which accepts only
  ``sha256[:-]<64 hex>`` digests and stores the blob as ``blobs/sha256-<hex>``;
  ``server/internal/manifest/manifest.go``: a JSON manifest whose ``layers`` carry
  ``mediaType`` and ``digest``). The GGUF is the layer of media type
  ``application/vnd.ollama.image.model``. The Linux service keeps its store in
  ``/usr/share/ollama/.ollama/models``, looked in when ``$OLLAMA_MODELS`` is not set.
- ``lmstudio:PUBLISHER/REPO[/FILE.gguf]``: LM Studio's documented layout,
  ``~/.lmstudio/models/PUBLISHER/REPO/*.gguf`` (older versions:
  ``~/.cache/lm-studio/models``). LM Studio keeps a moved folder in its own settings, so
  ``$SPECULATIVE_LLM_LMSTUDIO_MODELS`` names it here.
- ``hf:ORG/REPO[/FILE.gguf]``: the Hugging Face hub cache (``$HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, as ``huggingface_hub`` decides),
  ``models--ORG--REPO/snapshots/REVISION/``, the revision named by ``refs/main``. The
  hub itself is never asked.

A repository holding several GGUF files needs the file named (the error lists them).
Vision projectors (``mmproj*.gguf``) and the second and later parts of a split model
(``*-00002-of-00003.gguf``) are not models of their own and are left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from speculative_llm.engine.models.gguf_header import is_gguf_file
from speculative_llm.errors import ModelNotFoundError

__all__ = [
    "STORE_PREFIXES",
    "StoredModel",
    "find_stored_models",
    "hf_cache_roots",
    "lmstudio_roots",
    "ollama_roots",
    "resolve_stored_model",
    "store_prefix",
]

STORE_PREFIXES: tuple[str, ...] = ("ollama", "lmstudio", "hf")
"""The prefixes of store names (``ollama:...``, ``lmstudio:...``, ``hf:...``)."""

OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
_OLLAMA_REGISTRY, _OLLAMA_NAMESPACE, _OLLAMA_TAG = "registry.ollama.ai", "library", "latest"
_DIGEST = re.compile(r"^sha256[:-][0-9a-fA-F]{64}$")
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_LATER_SPLIT_PART = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")
_LMSTUDIO_ENV = "SPECULATIVE_LLM_LMSTUDIO_MODELS"
_LIST_LIMIT = 12


@dataclass(frozen=True, slots=True)
class StoredModel:
    """A GGUF model found in a user's store.

    Attributes:
        name: The name to pass (``ollama:smollm2:135m``, ``hf:ORG/REPO``...).
        store: Which store holds it (``Ollama``, ``LM Studio``, ``Hugging Face cache``).
        path: The GGUF file.
        size: Its size in bytes.
    """

    name: str
    store: str
    path: Path
    size: int


def store_prefix(name: str) -> str | None:
    """The store prefix ``name`` starts with (``ollama``, ``lmstudio``, ``hf``), else None."""
    head, colon, _ = name.partition(":")
    return head if colon and head in STORE_PREFIXES else None


def _env_path(variable: str) -> Path | None:
    # As Ollama's envconfig.Var: surrounding spaces and quotes do not count.
    value = os.environ.get(variable, "").strip().strip("\"'")
    return Path(value).expanduser() if value else None


def ollama_roots() -> list[Path]:
    """Where Ollama's store is looked for: ``$OLLAMA_MODELS`` alone when it is set."""
    configured = _env_path("OLLAMA_MODELS")
    if configured is not None:
        return [configured]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def lmstudio_roots() -> list[Path]:
    """Where LM Studio's models are looked for.

    ``$SPECULATIVE_LLM_LMSTUDIO_MODELS`` alone when it is set, else ``~/.lmstudio/models``
    and the older ``~/.cache/lm-studio/models``.
    """
    configured = _env_path(_LMSTUDIO_ENV)
    if configured is not None:
        return [configured]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def hf_cache_roots() -> list[Path]:
    """The Hugging Face hub cache, found as ``huggingface_hub`` finds it."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        configured = _env_path(variable)
        if configured is not None:
            return [configured]
    home = _env_path("HF_HOME")
    if home is None:
        cache = _env_path("XDG_CACHE_HOME") or Path.home() / ".cache"
        home = cache / "huggingface"
    return [home / "hub"]


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    more = len(names) - _LIST_LIMIT
    return shown + (f" and {more} more" if more > 0 else "")


def _error(message: str) -> ModelNotFoundError:
    return ModelNotFoundError(message, field="model")


def _existing(roots: list[Path], store: str, setting: str) -> list[Path]:
    found = [root for root in roots if root.is_dir()]
    if not found:
        raise _error(
            f"No {store} store on this machine: looked in {', '.join(map(str, roots))}. "
            f"Set {setting} to where it is, or pass a .gguf file."
        )
    return found


def _checked_parts(parts: list[str], name: str, form: str) -> list[str]:
    # Names become paths: nothing that climbs out of the store (``..``) or is empty.
    if not parts or any(not _PART.match(part) or part in (".", "..") for part in parts):
        raise _error(f"{name!r} is not a model name of the form {form}.")
    return parts


def _model_files(directory: Path) -> list[str]:
    """The GGUF models under ``directory`` as relative paths (projectors, later parts left out)."""
    files = []
    with contextlib.suppress(OSError):
        for path in directory.rglob("*.gguf"):
            later = _LATER_SPLIT_PART.search(path.name)
            if path.name.lower().startswith("mmproj") or (later and int(later.group(1)) > 1):
                continue
            files.append(path.relative_to(directory).as_posix())
    return sorted(files)


def _pick_file(directory: Path, name: str, requested: str | None, repo_name: str) -> Path:
    files = _model_files(directory)
    if requested is not None:
        if requested in files:
            return directory / requested
        raise _error(
            f"{name!r}: {directory} holds no {requested!r}; its GGUF files: "
            f"{_listed(files) or 'none'}."
        )
    if len(files) == 1:
        return directory / files[0]
    if not files:
        raise _error(f"{name!r}: {directory} holds no GGUF file.")
    raise _error(
        f"{name!r} holds several GGUF files ({_listed(files)}): name one, as in "
        f"{repo_name}/{files[0]}."
    )


# Ollama.


def _ollama_parts(name: str) -> tuple[str, str, str, str]:
    """``ollama:...`` as (host, namespace, model, tag), Ollama's defaults filled in."""
    reference = name.removeprefix("ollama:")
    path, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        path, tag = reference, _OLLAMA_TAG
    form = "ollama:NAME[:TAG], ollama:NAMESPACE/NAME:TAG or ollama:HOST/NAMESPACE/NAME:TAG"
    parts = _checked_parts([*path.split("/"), tag], name, form)[:-1]
    if len(parts) > 3:
        raise _error(f"{name!r} is not a model name of the form {form}.")
    defaults = [_OLLAMA_REGISTRY, _OLLAMA_NAMESPACE][: 3 - len(parts)]
    host, namespace, model = [*defaults, *parts]
    return host, namespace, model, tag


def _ollama_short_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name as ``ollama list`` shows it (modelpath.go ``GetShortTagname``)."""
    if host != _OLLAMA_REGISTRY:
        return f"ollama:{host}/{namespace}/{model}:{tag}"
    if namespace != _OLLAMA_NAMESPACE:
        return f"ollama:{namespace}/{model}:{tag}"
    return f"ollama:{model}:{tag}"


def _ollama_blob(root: Path, manifest: Path) -> Path | str:
    """The GGUF blob a manifest names, or why there is none."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
    except (OSError, ValueError, AttributeError) as error:
        return f"its manifest {manifest} cannot be read ({error})"
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE:
            digest = str(layer.get("digest", ""))
            if not _DIGEST.match(digest):
                return f"its manifest {manifest} names no sha256 digest ({digest!r})"
            blob = root / "blobs" / digest.replace(":", "-")
            if not blob.is_file():
                return f"its blob {blob} is missing (pull it again)"
            if not is_gguf_file(blob):
                return f"its blob {blob} is not a GGUF file"
            return blob
    return f"its manifest {manifest} has no {OLLAMA_MODEL_MEDIA_TYPE} layer (not a GGUF model)"


def _ollama_manifests(root: Path) -> Iterator[tuple[str, Path]]:
    with contextlib.suppress(OSError):
        for manifest in sorted((root / "manifests").glob("*/*/*/*")):
            if manifest.is_file():
                host, namespace, model, tag = manifest.relative_to(root / "manifests").parts
                yield _ollama_short_name(host, namespace, model, tag), manifest


def _resolve_ollama(name: str) -> Path:
    host, namespace, model, tag = _ollama_parts(name)
    roots = _existing(ollama_roots(), "Ollama", "OLLAMA_MODELS")
    for root in roots:
        manifest = root / "manifests" / host / namespace / model / tag
        if manifest.is_file():
            blob = _ollama_blob(root, manifest)
            if isinstance(blob, str):
                raise _error(f"{name!r} cannot be used: {blob}.")
            return blob
    held = [short for root in roots for short, _ in _ollama_manifests(root)]
    raise _error(
        f"Ollama holds no {_ollama_short_name(host, namespace, model, tag)!r} (looked in "
        f"{', '.join(map(str, roots))}). It holds: {_listed(held) or 'nothing'}. Pull it "
        f"with `ollama pull {model}:{tag}`, or pass one of these."
    )


def _ollama_models() -> Iterator[StoredModel]:
    for root in ollama_roots():
        for short, manifest in _ollama_manifests(root):
            blob = _ollama_blob(root, manifest)
            if isinstance(blob, Path):
                yield StoredModel(short, "Ollama", blob, blob.stat().st_size)


# LM Studio.


def _repo_reference(name: str, prefix: str, form: str) -> tuple[str, str, str | None]:
    """``PREFIX:A/B[/FILE]`` as (A, B, FILE or None)."""
    parts = _checked_parts(name.removeprefix(prefix).split("/"), name, form)
    if len(parts) < 2 or (len(parts) > 2 and not parts[-1].endswith(".gguf")):
        raise _error(f"{name!r} is not a model name of the form {form}.")
    return parts[0], parts[1], "/".join(parts[2:]) or None


def _resolve_lmstudio(name: str) -> Path:
    form = "lmstudio:PUBLISHER/REPO or lmstudio:PUBLISHER/REPO/FILE.gguf"
    publisher, repo, file = _repo_reference(name, "lmstudio:", form)
    roots = _existing(lmstudio_roots(), "LM Studio", f"${_LMSTUDIO_ENV}")
    for root in roots:
        directory = root / publisher / repo
        if directory.is_dir():
            return _pick_file(directory, name, file, f"lmstudio:{publisher}/{repo}")
    held = [model.name for model in _lmstudio_models()]
    raise _error(
        f"LM Studio holds no {publisher}/{repo} (looked in {', '.join(map(str, roots))}). "
        f"It holds: {_listed(held) or 'nothing'}."
    )


def _repo_models(
    store: str, prefix: str, repos: Iterator[tuple[str, Path]]
) -> Iterator[StoredModel]:
    """Each GGUF of each (``A/B``, directory), named shortly when it is its repo's only one."""
    for repo_name, directory in repos:
        files = _model_files(directory)
        for file in files:
            name = f"{prefix}{repo_name}" + (f"/{file}" if len(files) > 1 else "")
            path = directory / file
            with contextlib.suppress(OSError):
                yield StoredModel(name, store, path, path.stat().st_size)


def _lmstudio_repos() -> Iterator[tuple[str, Path]]:
    for root in lmstudio_roots():
        with contextlib.suppress(OSError):
            for directory in sorted(root.glob("*/*")):
                if directory.is_dir():
                    yield f"{directory.parent.name}/{directory.name}", directory


def _lmstudio_models() -> Iterator[StoredModel]:
    return _repo_models("LM Studio", "lmstudio:", _lmstudio_repos())


# Hugging Face cache.


def _hf_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot ``refs/main`` names, else the newest one."""
    with contextlib.suppress(OSError):
        revision = (repo_dir / "refs" / "main").read_text(encoding="utf-8").strip()
        if revision and (repo_dir / "snapshots" / revision).is_dir():
            return repo_dir / "snapshots" / revision
    with contextlib.suppress(OSError):
        snapshots = [p for p in (repo_dir / "snapshots").iterdir() if p.is_dir()]
        if snapshots:
            return max(snapshots, key=lambda p: p.stat().st_mtime)
    return None


def _resolve_hf(name: str) -> Path:
    form = "hf:ORG/REPO or hf:ORG/REPO/FILE.gguf"
    org, repo, file = _repo_reference(name, "hf:", form)
    roots = _existing(hf_cache_roots(), "Hugging Face cache", "HF_HUB_CACHE (or HF_HOME)")
    for root in roots:
        snapshot = _hf_snapshot(root / f"models--{org}--{repo}")
        if snapshot is not None:
            return _pick_file(snapshot, name, file, f"hf:{org}/{repo}")
    held = [model.name for model in _hf_models()]
    raise _error(
        f"The Hugging Face cache holds no {org}/{repo} (looked in "
        f"{', '.join(map(str, roots))}; the hub is not asked). It holds GGUF models: "
        f"{_listed(held) or 'none'}. Download it first (`hf download {org}/{repo}`)."
    )


def _hf_repos() -> Iterator[tuple[str, Path]]:
    for root in hf_cache_roots():
        with contextlib.suppress(OSError):
            for repo_dir in sorted(root.glob("models--*--*")):
                _, org, repo = repo_dir.name.split("--", 2)
                snapshot = _hf_snapshot(repo_dir)
                if snapshot is not None:
                    yield f"{org}/{repo}", snapshot


def _hf_models() -> Iterator[StoredModel]:
    return _repo_models("Hugging Face cache", "hf:", _hf_repos())


_RESOLVERS: dict[str, Callable[[str], Path]] = {
    "ollama": _resolve_ollama,
    "lmstudio": _resolve_lmstudio,
    "hf": _resolve_hf,
}


def resolve_stored_model(name: str) -> Path:
    """The GGUF file a store name (``ollama:...``, ``lmstudio:...``, ``hf:...``) points to.

    Raises:
        ModelNotFoundError: Not a store name, a malformed one, a store that is not on
            this machine (the message says where it looked), a model the store does not
            hold (the message lists what it holds), or a repository of several GGUF
            files with none named (the message lists them).
    """
    prefix = store_prefix(name)
    if prefix is None:
        raise _error(
            f"{name!r} names no store: start it with {', '.join(p + ':' for p in STORE_PREFIXES)}."
        )
    return _RESOLVERS[prefix](name)


def find_stored_models() -> list[StoredModel]:
    """Every GGUF model in this user's Ollama store, LM Studio folder and HF cache.

    Stores that are not there are skipped; nothing is downloaded or loaded.
    """
    found: list[StoredModel] = []
    for models in (_ollama_models, _lmstudio_models, _hf_models):
        found.extend(models())
    return found
