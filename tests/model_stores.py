"""Ollama stores, LM Studio folders and Hugging Face caches built in a test's directory.

Each builder lays out what the tool itself writes (see ``engine/models/stores.py`` for
the sources) and links the GGUF files in (a symbolic link: the real 98 MB file is never
copied). ``isolate_stores`` points every store's variable at empty directories, so a
test sees only the stores it builds, never the machine's own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from speculative_llm.engine.models.sources import cached_packaged_model_path

OLLAMA_MODEL = "application/vnd.ollama.image.model"


def packaged_gguf(alias: str) -> Path:
    """The cached file of a packaged model; skips the test when it is not cached."""
    path = cached_packaged_model_path(alias)
    if path is None:
        pytest.skip(f"{alias} is not cached (speculative-llm models pull {alias} fetches it)")
    return path


def isolate_stores(monkeypatch: pytest.MonkeyPatch, root: Path) -> dict[str, Path]:
    """Point Ollama, LM Studio and the HF cache at (empty) directories under ``root``."""
    roots = {
        "OLLAMA_MODELS": root / "ollama",
        "SPECULATIVE_LLM_LMSTUDIO_MODELS": root / "lmstudio",
        "HF_HUB_CACHE": root / "hf",
    }
    for variable, path in roots.items():
        monkeypatch.setenv(variable, str(path))
    return roots


def add_ollama_model(
    root: Path, name: str, gguf: Path, *, tag: str = "latest", namespace: str = "library"
) -> Path:
    """Add ``NAMESPACE/NAME:TAG`` to the Ollama store at ``root`` (a manifest and a blob)."""
    digest = hashlib.sha256(f"{namespace}/{name}:{tag}:{gguf}".encode()).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.symlink_to(gguf)
    template = root / "blobs" / f"sha256-{'0' * 64}"
    template.write_text("{{ .Prompt }}")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json"},
        "layers": [
            {"mediaType": OLLAMA_MODEL, "digest": f"sha256:{digest}", "size": gguf.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{'0' * 64}"},
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def add_lmstudio_model(root: Path, repo: str, files: dict[str, Path]) -> Path:
    """Add ``PUBLISHER/REPO`` holding ``files`` (name: GGUF to link) to LM Studio's folder."""
    directory = root / repo
    directory.mkdir(parents=True, exist_ok=True)
    for name, gguf in files.items():
        (directory / name).symlink_to(gguf)
    return directory


def add_hf_model(
    root: Path, repo: str, files: dict[str, Path], *, revision: str = "a" * 40
) -> Path:
    """Add ``ORG/REPO`` at ``revision`` (named by refs/main) to the HF cache at ``root``."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    for name, gguf in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(name.encode()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.symlink_to(gguf)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(blob)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot
