"""Unit tests run with sockets disabled (unix sockets stay: asyncio's self-pipe needs them),
and see none of the machine's own model stores (Ollama, LM Studio, the HF cache)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_socket import disable_socket, enable_socket


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    disable_socket(allow_unix_socket=True)
    yield
    enable_socket()


@pytest.fixture(autouse=True)
def _no_user_stores(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the page offers and what draft_model="auto" picks depend on these stores:
    # a test builds the ones it needs (tests/model_stores.py), else there are none.
    absent = tmp_path_factory.getbasetemp() / "no-user-stores"
    for variable in ("OLLAMA_MODELS", "SPECULATIVE_LLM_LMSTUDIO_MODELS", "HF_HUB_CACHE"):
        monkeypatch.setenv(variable, str(absent / variable.lower()))
