"""Models in the user's own stores (Ollama, LM Studio, the HF cache) by name, and listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_headers import write_gguf_header
from model_stores import (
    add_hf_model,
    add_lmstudio_model,
    add_ollama_model,
    isolate_stores,
    packaged_gguf,
)
from speculative_llm.engine.models.sources import resolve_model
from speculative_llm.engine.models.stores import find_stored_models, resolve_stored_model
from speculative_llm.errors import ModelNotFoundError


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    return isolate_stores(monkeypatch, tmp_path / "stores")


@pytest.fixture
def header(tmp_path: Path) -> Path:
    """A GGUF with a header only (a few hundred bytes): enough to be found and listed."""
    return write_gguf_header(tmp_path / "header.gguf", [f"t{i}" for i in range(20)])


def test_an_ollama_name_resolves_to_the_blob_its_manifest_names(roots: dict[str, Path]) -> None:
    smollm2 = packaged_gguf("smollm2-135m")
    blob = add_ollama_model(roots["OLLAMA_MODELS"], "smollm2", smollm2, tag="135m")
    source = resolve_model("ollama:smollm2:135m")
    assert (source.kind, Path(source.location) / str(source.gguf_file)) == ("gguf", blob)
    assert (Path(source.location) / str(source.gguf_file)).resolve() == smollm2.resolve()


def test_ollama_tags_default_to_latest_and_namespaces_are_kept(
    roots: dict[str, Path], header: Path
) -> None:
    store = roots["OLLAMA_MODELS"]
    latest = add_ollama_model(store, "tiny", header)
    namespaced = add_ollama_model(store, "tiny", header, tag="q4", namespace="someone")
    assert resolve_stored_model("ollama:tiny") == latest
    assert resolve_stored_model("ollama:tiny:latest") == latest
    assert resolve_stored_model("ollama:someone/tiny:q4") == namespaced
    assert resolve_stored_model("ollama:registry.ollama.ai/someone/tiny:q4") == namespaced


def test_an_unknown_ollama_model_is_refused_listing_what_the_store_holds(
    roots: dict[str, Path], header: Path
) -> None:
    add_ollama_model(roots["OLLAMA_MODELS"], "tiny", header, tag="q4")
    with pytest.raises(ModelNotFoundError, match="ollama pull qwen3:latest") as caught:
        resolve_model("ollama:qwen3")
    assert "It holds: ollama:tiny:q4" in str(caught.value)
    assert caught.value.field == "model"


def test_a_missing_store_says_where_it_looked(roots: dict[str, Path]) -> None:
    for name, root in [
        ("ollama:tiny", roots["OLLAMA_MODELS"]),
        ("lmstudio:pub/repo", roots["SPECULATIVE_LLM_LMSTUDIO_MODELS"]),
        ("hf:org/repo", roots["HF_HUB_CACHE"]),
    ]:
        with pytest.raises(ModelNotFoundError, match="store on this machine: looked in") as caught:
            resolve_model(name)
        assert str(root) in str(caught.value)


def test_ollama_defaults_include_the_linux_service_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from speculative_llm.engine.models.stores import ollama_roots

    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    assert Path("/usr/share/ollama/.ollama/models") in ollama_roots()
    monkeypatch.setenv("OLLAMA_MODELS", ' "/srv/ollama" ')
    assert ollama_roots() == [Path("/srv/ollama")]


@pytest.mark.parametrize(
    "name",
    [
        "ollama:../secret:latest",
        "hf:../secret",
        "ollama:a/b/c/d:tag",
        "hf:org",
        "lmstudio:p/r/notes.txt",
    ],
)
def test_malformed_store_names_are_refused(roots: dict[str, Path], name: str) -> None:
    with pytest.raises(ModelNotFoundError, match="not a model name of the form"):
        resolve_model(name)


def test_an_ollama_model_without_a_gguf_layer_is_refused(
    roots: dict[str, Path], header: Path
) -> None:
    store = roots["OLLAMA_MODELS"]
    add_ollama_model(store, "tiny", header)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.write_text('{"layers": [{"mediaType": "application/vnd.ollama.image.tensor"}]}')
    with pytest.raises(ModelNotFoundError, match="not a GGUF model"):
        resolve_model("ollama:tiny")


def test_lmstudio_and_hf_names_resolve_to_their_single_gguf(
    roots: dict[str, Path], header: Path
) -> None:
    lmstudio = add_lmstudio_model(
        roots["SPECULATIVE_LLM_LMSTUDIO_MODELS"],
        "pub/Tiny-GGUF",
        {"tiny-q4.gguf": header, "mmproj-tiny.gguf": header},
    )
    assert resolve_stored_model("lmstudio:pub/Tiny-GGUF") == lmstudio / "tiny-q4.gguf"
    snapshot = add_hf_model(roots["HF_HUB_CACHE"], "org/Tiny-GGUF", {"tiny.gguf": header})
    source = resolve_model("hf:org/Tiny-GGUF")
    assert Path(source.location) / str(source.gguf_file) == snapshot / "tiny.gguf"


def test_the_hf_cache_follows_refs_main(roots: dict[str, Path], header: Path) -> None:
    cache = roots["HF_HUB_CACHE"]
    current = add_hf_model(cache, "org/Tiny-GGUF", {"new.gguf": header}, revision="2" * 40)
    # A later snapshot (another branch, say) is newer on disk, but main names the first.
    add_hf_model(cache, "org/Tiny-GGUF", {"other.gguf": header}, revision="1" * 40)
    (cache / "models--org--Tiny-GGUF" / "refs" / "main").write_text("2" * 40)
    assert resolve_stored_model("hf:org/Tiny-GGUF") == current / "new.gguf"


def test_several_ggufs_are_refused_until_one_is_named(roots: dict[str, Path], header: Path) -> None:
    snapshot = add_hf_model(
        roots["HF_HUB_CACHE"], "org/Tiny-GGUF", {"tiny-q4.gguf": header, "tiny-q8.gguf": header}
    )
    with pytest.raises(ModelNotFoundError, match="several GGUF files") as caught:
        resolve_model("hf:org/Tiny-GGUF")
    assert "tiny-q4.gguf, tiny-q8.gguf" in str(caught.value)
    assert "hf:org/Tiny-GGUF/tiny-q4.gguf" in str(caught.value)
    assert resolve_stored_model("hf:org/Tiny-GGUF/tiny-q8.gguf") == snapshot / "tiny-q8.gguf"
    with pytest.raises(ModelNotFoundError, match=r"holds no 'tiny-f16\.gguf'"):
        resolve_model("hf:org/Tiny-GGUF/tiny-f16.gguf")


def test_unknown_repos_are_refused_listing_the_store(roots: dict[str, Path], header: Path) -> None:
    add_lmstudio_model(roots["SPECULATIVE_LLM_LMSTUDIO_MODELS"], "pub/A", {"a.gguf": header})
    add_hf_model(roots["HF_HUB_CACHE"], "org/B", {"b.gguf": header})
    with pytest.raises(ModelNotFoundError, match=r"It holds: lmstudio:pub/A\."):
        resolve_model("lmstudio:pub/Other")
    with pytest.raises(ModelNotFoundError, match=r"hub is not asked.*hf:org/B\."):
        resolve_model("hf:org/Other")


def test_every_store_model_is_listed_with_the_name_to_pass(
    roots: dict[str, Path], header: Path
) -> None:
    add_ollama_model(roots["OLLAMA_MODELS"], "tiny", header, tag="q4")
    add_lmstudio_model(
        roots["SPECULATIVE_LLM_LMSTUDIO_MODELS"],
        "pub/Tiny-GGUF",
        {"a.gguf": header, "b.gguf": header, "big-00002-of-00002.gguf": header},
    )
    add_hf_model(roots["HF_HUB_CACHE"], "org/Tiny-GGUF", {"tiny.gguf": header})
    found = find_stored_models()
    assert [(model.store, model.name) for model in found] == [
        ("Ollama", "ollama:tiny:q4"),
        ("LM Studio", "lmstudio:pub/Tiny-GGUF/a.gguf"),
        ("LM Studio", "lmstudio:pub/Tiny-GGUF/b.gguf"),
        ("Hugging Face cache", "hf:org/Tiny-GGUF"),
    ]
    assert {model.size for model in found} == {header.stat().st_size}
    for model in found:
        assert resolve_stored_model(model.name) == model.path


def test_models_list_shows_store_models_with_their_names_and_headers(
    roots: dict[str, Path], header: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from speculative_llm.cli import main

    blob = add_ollama_model(roots["OLLAMA_MODELS"], "tiny", header, tag="q4")
    add_hf_model(roots["HF_HUB_CACHE"], "org/Tiny-GGUF", {"tiny.gguf": header})
    assert main(["models", "list"]) == 0
    stores = capsys.readouterr().out.split("In your stores")[1]
    assert "ollama:tiny:q4" in stores and "hf:org/Tiny-GGUF" in stores
    assert "Ollama: llama, gpt2 tokenizer, 20 tokens" in stores
    assert main(["models", "path", "ollama:tiny:q4"]) == 0
    assert capsys.readouterr().out.strip() == str(blob)


def test_models_list_says_where_it_looked_when_the_stores_are_empty(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from speculative_llm.cli import main

    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "No GGUF models in your stores; looked in:" in out
    assert f"Ollama: {roots['OLLAMA_MODELS']}" in out


def test_a_managed_llama_server_takes_store_names_too(roots: dict[str, Path], header: Path) -> None:
    from speculative_llm.servers.llama_flags import resolve_gguf

    blob = add_ollama_model(roots["OLLAMA_MODELS"], "tiny", header, tag="q4")
    add_hf_model(roots["HF_HUB_CACHE"], "org/Tiny-GGUF", {"tiny.gguf": header})
    assert resolve_gguf("ollama:tiny:q4") == blob
    assert resolve_gguf("hf:org/Tiny-GGUF").name == "tiny.gguf"
    with pytest.raises(ModelNotFoundError, match="Ollama holds no") as caught:
        resolve_gguf("ollama:other", role="draft_model")
    assert caught.value.field == "draft_model"
