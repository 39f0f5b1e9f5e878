"""What the user chose in the page, as one validated record."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from speculative_llm.backends.registry import BUILTIN_BACKENDS
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest, Message

__all__ = [
    "BACKEND_KINDS",
    "DEFAULT_MODEL",
    "MAX_RUNS",
    "PACKAGED_MODELS",
    "SERVER_KINDS",
    "TIMING_MODES",
    "BackendKind",
    "RunSettings",
    "TimingChoice",
    "TimingMode",
]

BackendKind = Literal["local", "managed", "url"]
TimingChoice = Literal["auto", "interleaved", "fair", "concurrent"]
TimingMode = Literal["interleaved", "fair", "concurrent"]
"""``interleaved``: both sides on one machine, taking turns step by step, each timed over
its own steps (local engine). ``fair``: one side after the other, each with the machine
to itself. ``concurrent``: both at once (fair only when they run on different machines)."""
TIMING_MODES: tuple[TimingMode, ...] = ("interleaved", "fair", "concurrent")
MAX_RUNS = 10
"""The most repeats of one comparison (the page shows their median and spread)."""

BACKEND_KINDS: dict[str, str] = {
    "local": "Local engine (embedded)",
    "managed": "Managed llama-server",
    "url": "Running server (URL)",
}
"""Backend kinds and their labels in the page."""

SERVER_KINDS: dict[str, str] = {
    entry.name: entry.label for entry in BUILTIN_BACKENDS if entry.server
}
"""Names accepted by ``create_backend`` for servers reached by URL, and their labels."""

DEFAULT_MODEL = "smollm2-135m"
PACKAGED_MODELS: tuple[str, ...] = (
    "smollm2-135m",
    "gemma3-270m",
    "smollm2-135m-f16",
    "gemma3-270m-f16",
)
"""Models shipped as PyPI packages, and their F16 variants made from them on first use
(llama-quantize, no download): they load with no model hub."""

_METHODS_BY_KIND: dict[str, tuple[str, ...]] = {
    "local": ("ngram", "suffix", "draft_model"),
    "managed": ("ngram", "draft_model"),
    "url": ("server", "ngram", "draft_model", "eagle", "eagle3", "mtp"),
}


@dataclass(frozen=True, slots=True)
class RunSettings:
    """One comparison's configuration, as chosen in the page.

    Attributes:
        backend: ``local`` (in-process engine), ``managed`` (a llama-server the app
            starts) or ``url`` (a server that is already running).
        model: Target model: packaged alias, Hugging Face id, local directory or
            ``.gguf`` file (``local``/``managed``); the served model name for ``url``
            (empty: the server's default).
        draft_model: Draft model for ``method="draft_model"``.
        method: Speculative method of the speculative side; ``server`` keeps what a
            running server was started with.
        k: Draft length (tokens proposed per verify step).
        temperature: 0 for greedy decoding.
        max_tokens: Most tokens each side generates.
        timing: ``interleaved`` (local engine only), ``fair``, ``concurrent`` or ``auto``
            (interleaved on the local engine; for servers fair, unless the two sides
            run on different hosts).
        server_kind: Kind of the running server (``url`` backend): a ``SERVER_KINDS`` key.
        server_url: URL of the running server (the speculative side).
        baseline_url: URL of a second server without speculation, for servers that
            cannot switch it off per request (empty: use ``server_url``).
        api_key: API key for the servers; never displayed or stored in the history.
        seed: Sampling seed shared by both sides (so sampled runs are comparable).
        runs: How many times the comparison runs (the speedup is their median).
        json_schema: A JSON schema (as text) both sides' answers must follow; empty
            for free text. The local engine decodes under its grammar, drafts included.
    """

    backend: BackendKind = "local"
    model: str = DEFAULT_MODEL
    draft_model: str | None = None
    method: str = "ngram"
    k: int = 5
    temperature: float = 0.0
    max_tokens: int = 128
    timing: TimingChoice = "auto"
    server_kind: str = "llamacpp"
    server_url: str = ""
    baseline_url: str = ""
    api_key: str | None = field(default=None, repr=False)
    seed: int = 0
    runs: int = 1
    json_schema: str = ""

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_KINDS:
            raise ConfigError(
                f"Unknown backend kind {self.backend!r}; choose one of {', '.join(BACKEND_KINDS)}.",
                field="backend",
            )
        methods = _METHODS_BY_KIND[self.backend]
        if self.method not in methods:
            raise ConfigError(
                f"Method {self.method!r} is not available with the "
                f"{BACKEND_KINDS[self.backend]}; choose one of {', '.join(methods)}.",
                field="method",
            )
        if self.method == "draft_model" and not (self.draft_model or "").strip():
            raise ConfigError(
                "The draft-model method needs a draft model with the target's vocabulary: "
                "pick one under Draft model in the settings (it lists the models that pair "
                "with the target), or choose Prompt lookup (n-gram), which needs none.",
                field="draft_model",
            )
        if self.backend != "url" and not self.model.strip():
            raise ConfigError("Choose a model.", field="model")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 64:
            raise ConfigError(f"k must be an integer from 1 to 64, got {self.k!r}.", field="k")
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise ConfigError(
                f"max tokens must be a positive integer, got {self.max_tokens!r}.",
                field="max_tokens",
            )
        if self.temperature < 0:
            raise ConfigError(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature}.",
                field="temperature",
            )
        if self.timing not in ("auto", *TIMING_MODES):
            raise ConfigError(
                f"Unknown timing mode {self.timing!r}; choose auto, {', '.join(TIMING_MODES)}.",
                field="timing",
            )
        if self.timing == "interleaved" and self.backend != "local":
            raise ConfigError(
                "Interleaved timing needs the local engine: a server generates on its own "
                "schedule and cannot take turns. Choose fair (one side after the other) or, "
                "for servers on two machines, concurrent.",
                field="timing",
            )
        if isinstance(self.runs, bool) or not isinstance(self.runs, int):
            raise ConfigError(f"runs must be an integer, got {self.runs!r}.", field="runs")
        if not 1 <= self.runs <= MAX_RUNS:
            raise ConfigError(f"runs must be from 1 to {MAX_RUNS}, got {self.runs}.", field="runs")
        self.schema()  # a schema that is not a JSON object fails here, before any run
        if self.backend == "url":
            if self.server_kind not in SERVER_KINDS:
                raise ConfigError(
                    f"Unknown server kind {self.server_kind!r}; choose one of "
                    f"{', '.join(SERVER_KINDS)}.",
                    field="server_kind",
                )
            if not self.server_url.strip():
                raise ConfigError(
                    "Enter the URL of the running server, for example http://127.0.0.1:8080.",
                    field="server_url",
                )

    @property
    def draft_model_used(self) -> str | None:
        """The draft model, when the method uses one."""
        if self.method != "draft_model":
            return None
        return (self.draft_model or "").strip() or None

    def spec_config(self) -> SpecConfig | None:
        """The speculative side's configuration (None: the server's own, for ``server``)."""
        if self.method == "server":
            return None
        return SpecConfig(
            method=self.method,  # type: ignore[arg-type]  # validated in __post_init__
            num_speculative_tokens=self.k,
            draft_model=self.draft_model_used,
            # The local engine drafts only what pays (k is the longest draft): on a CPU a
            # fixed k loses to plain decoding on free text. Servers ignore it.
            cost_aware=self.backend == "local",
        )

    def timing_mode(self) -> TimingMode:
        """The timing mode to use.

        ``auto`` is interleaved on the local engine; for servers it is fair, unless the
        two sides run on different hosts (then concurrent).
        """
        if self.timing != "auto":
            return self.timing
        if self.backend == "local":
            return "interleaved"
        if self.backend == "url" and self.baseline_url.strip():
            speculative_host = urlsplit(self.server_url.strip()).hostname
            baseline_host = urlsplit(self.baseline_url.strip()).hostname
            if speculative_host != baseline_host:
                return "concurrent"
        return "fair"

    def schema(self) -> dict[str, Any] | None:
        """The parsed JSON schema (None: free text).

        Raises:
            ConfigError: The text is not JSON, or not a JSON object.
        """
        text = self.json_schema.strip() if isinstance(self.json_schema, str) else ""
        if not text:
            return None
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"The JSON schema is not valid JSON: {error.msg} at line {error.lineno}, "
                f"column {error.colno}. Fix it, or clear the box for free text.",
                field="json_schema",
            ) from None
        if not isinstance(schema, dict):
            raise ConfigError(
                "The JSON schema must be a JSON object such as "
                '{"type": "object", "properties": {...}}; clear the box for free text.',
                field="json_schema",
            )
        return schema

    def response_format(self) -> dict[str, Any] | None:
        """The OpenAI ``response_format`` both sides send (None: free text)."""
        schema = self.schema()
        if schema is None:
            return None
        return {"type": "json_schema", "json_schema": {"name": "playground", "schema": schema}}

    def request(self, prompt: str) -> GenerationRequest:
        """The chat request both sides answer (``spec`` is set per side).

        Raises:
            ConfigError: The prompt is empty.
        """
        if not prompt.strip():
            raise ConfigError("Type a prompt or pick a preset first.", field="prompt")
        return GenerationRequest(
            messages=(Message(role="user", content=prompt),),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            model=(self.model.strip() or None) if self.backend == "url" else None,
            response_format=self.response_format(),
            # Each side processes its whole prompt: the local engine would otherwise start
            # from what its cache kept of the side that ran before it on the same engine.
            extra={"cache_prompt": False} if self.backend == "local" else {},
        )

    def describe_backend(self) -> str:
        """Short description of the backend for tables (no URL credentials, no key)."""
        if self.backend == "url":
            host = urlsplit(self.server_url.strip()).netloc.rpartition("@")[2]
            return f"{self.server_kind} @ {host}"
        return "local" if self.backend == "local" else "llama-server (managed)"
