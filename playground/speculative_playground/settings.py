"""What the user chose in the page, as one validated record."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from speculative_llm.backends.registry import BUILTIN_BACKENDS
from speculative_llm.config import DEFAULT_LONGEST_DRAFT, EXACT_POLICIES, SpecConfig
from speculative_llm.config import default_draft_length as config_default_draft_length
from speculative_llm.drafter_registry import drafter_entries
from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest, Message

__all__ = [
    "AUTO_DRAFT",
    "AUTO_DRAFT_LABEL",
    "BACKEND_KINDS",
    "BITWISE_ADVICE",
    "DEFAULT_MODEL",
    "EXACTNESS_LABEL",
    "EXACT_LABELS",
    "MAX_RUNS",
    "METHODS_BY_KIND",
    "METHOD_LABELS",
    "PACKAGED_MODELS",
    "SERVER_KINDS",
    "TIMING_LABELS",
    "TIMING_MODES",
    "BackendKind",
    "ExactPolicy",
    "RunSettings",
    "TimingChoice",
    "TimingMode",
    "default_draft_length",
    "greedy_hint",
    "model_choices",
    "page_methods",
]

BackendKind = Literal["local", "managed", "url"]
ExactPolicy = Literal["distribution", "bitwise"]
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


AUTO_DRAFT = "auto"
"""The draft model that asks the core to pick one (``engine.models.draft_choice``'s
``AUTO_DRAFT``, spelled here: importing the engine loads it, and the page does so only
when a run picks)."""
AUTO_DRAFT_LABEL = "auto (smallest model with the target's vocabulary)"
"""The label of ``AUTO_DRAFT`` (``"auto"``) among the draft models: the first choice."""


def model_choices(*first: str) -> tuple[str, ...]:
    """The target models the page offers: ``first``, the packaged ones, then the user's own.

    The user's own are the GGUF models in their Ollama store, LM Studio folder and
    Hugging Face cache, under the names that load them (``ollama:NAME:TAG``...); looked
    up on each call, reading directories only (no model is opened).
    """
    from speculative_llm.engine.models.stores import find_stored_models

    stored = (model.name for model in find_stored_models())
    return tuple(dict.fromkeys([*first, *PACKAGED_MODELS, *stored]))


METHODS_BY_KIND: dict[str, tuple[str, ...]] = {
    "local": tuple(entry.name for entry in drafter_entries()),
    "managed": ("ngram", "draft_model"),
    "url": ("server", "ngram", "draft_model", "eagle", "eagle3", "mtp"),
}
"""The methods each backend kind runs (what ``RunSettings`` accepts): the local engine's
are its drafters (``drafter_registry``, read when the playground is imported)."""

_SERVER_ONLY_LABELS = {
    "server": "As the server was started (running servers)",
    "eagle": "EAGLE (running servers)",
    "eagle3": "EAGLE-3 (running servers)",
    "mtp": "MTP heads (running servers)",
}
METHOD_LABELS: dict[str, str] = {
    **{
        entry.name: entry.label
        if entry.name in METHODS_BY_KIND["managed"] + METHODS_BY_KIND["url"]
        else f"{entry.label} (local engine)"
        for entry in drafter_entries()
    },
    **_SERVER_ONLY_LABELS,
}
"""Speculative methods and their labels in the page (errors name methods by these): a
drafter's label from its registry entry, marked when only the local engine runs it."""

TIMING_LABELS: dict[str, str] = {
    "auto": "Auto",
    "interleaved": "Interleaved (local engine)",
    "fair": "Fair (one after the other)",
    "concurrent": "Concurrent",
}
"""Timing choices and their labels in the page."""

EXACTNESS_LABEL = "Exactness"
"""The label of the exactness setting in the page."""

EXACT_LABELS: dict[str, str] = {"distribution": "Distribution", "bitwise": "Bitwise"}
"""The local engine's exactness policies (``LocalBackend(exact=...)``) and their labels."""

BITWISE_ADVICE = (
    f"for token-identical text, set {EXACTNESS_LABEL} to {EXACT_LABELS['bitwise']} in the settings"
)
"""What the page advises when greedy texts part at a near-tie under ``distribution``."""


def _labels(names: Sequence[str], labels: dict[str, str]) -> str:
    """``A, B or C``: the page's labels of ``names``."""
    shown = [labels.get(name, name) for name in names]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _choices(labels: dict[str, str]) -> str:
    """``A ("a"), B ("b") or C ("c")``: labels with the values an API caller sends."""
    return _labels([f'{label} ("{value}")' for value, label in labels.items()], {})


def page_methods(backend: str, *, draft_pairs: bool) -> tuple[str, ...]:
    """The methods the page offers for ``backend``: those it runs and can be set there.

    Args:
        backend: A ``BACKEND_KINDS`` key.
        draft_pairs: Whether a draft model that pairs with the target can be chosen
            (``pairings.draft_candidates``, or a model the user may type).

    Returns:
        ``METHODS_BY_KIND[backend]`` without the draft-model method where no draft can be
        picked: with no pairing model, or for running servers (the page has no draft
        picker for them; the API still takes one).
    """
    methods = METHODS_BY_KIND.get(backend, ())
    if backend == "url" or not draft_pairs:
        methods = tuple(m for m in methods if m != "draft_model")
    return methods


def default_draft_length(backend: str) -> int:
    """The draft length k a backend kind starts with.

    The local engine drafts cost-aware, so k is its longest draft
    (``DEFAULT_LONGEST_DRAFT``); a server drafts a fixed length, where a long k wastes
    verification whenever drafts are rejected (``DEFAULT_FIXED_DRAFT``).
    """
    return config_default_draft_length(cost_aware=backend == "local")


def greedy_hint(backend: str, exact: str) -> str:
    """What greedy decoding (temperature 0) promises with this backend and exactness.

    Only ``exact="bitwise"`` on the local engine promises token-identical texts; under
    ``distribution``, and on servers, which verify in batches with other kernels than
    one-token passes, greedy texts may part where the top two tokens nearly tie.
    """
    if backend == "local":
        policy = EXACT_LABELS.get(exact, exact)
        promise = (
            "both sides give the same text"
            if exact == "bitwise"
            else "the texts may part where two tokens nearly tie"
        )
        return f"0 = greedy. Under {policy} {EXACTNESS_LABEL.lower()} {promise}."
    server = "llama-server verifies" if backend == "managed" else "Servers verify"
    return f"0 = greedy. {server} in batches: the texts may part where two tokens nearly tie."


@dataclass(frozen=True, slots=True)
class RunSettings:
    """One comparison's configuration, as chosen in the page.

    Attributes:
        backend: ``local`` (in-process engine), ``managed`` (a llama-server the app
            starts) or ``url`` (a server that is already running).
        model: Target model: packaged alias, Hugging Face id, local directory or
            ``.gguf`` file (``local``/``managed``); the served model name for ``url``
            (empty: the server's default).
        draft_model: Draft model for ``method="draft_model"``; ``auto`` picks the
            smallest offered GGUF with the target's vocabulary when the run starts
            (the local engine and the managed llama-server).
        method: Speculative method of the speculative side; ``server`` keeps what a
            running server was started with.
        k: Draft length: the local engine's longest draft (it drafts only what pays),
            a server's fixed draft length (``default_draft_length`` by backend kind).
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
        exact: The local engine's exactness policy (``LocalBackend(exact=...)``), for
            both sides: ``distribution`` (every pass at full speed; greedy texts may
            part where two tokens nearly tie) or ``bitwise`` (greedy texts
            token-identical). Servers ignore it.
    """

    backend: BackendKind = "local"
    model: str = DEFAULT_MODEL
    draft_model: str | None = None
    method: str = "ngram"
    k: int = DEFAULT_LONGEST_DRAFT  # default_draft_length of the default backend, local
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
    exact: ExactPolicy = "distribution"

    def __post_init__(self) -> None:
        # The messages name settings by their labels in the page: a page user never
        # sees an internal id (values only an API caller can send are quoted too).
        if self.backend not in BACKEND_KINDS:
            raise ConfigError(
                f"Unknown backend {self.backend!r}; choose {_choices(BACKEND_KINDS)}.",
                field="backend",
            )
        self._check_method()
        if self.backend != "url" and not self.model.strip():
            raise ConfigError("Choose a target model.", field="model")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 64:
            raise ConfigError(
                f"Draft length k must be a whole number from 1 to 64, got {self.k!r}.",
                field="k",
            )
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise ConfigError(
                f"Max tokens must be a whole number of at least 1, got {self.max_tokens!r}.",
                field="max_tokens",
            )
        if self.temperature < 0:
            raise ConfigError(
                f"Temperature must be 0 or more (0 = greedy), got {self.temperature}.",
                field="temperature",
            )
        if self.timing not in TIMING_LABELS:
            raise ConfigError(
                f"Unknown timing mode {self.timing!r}; choose {_choices(TIMING_LABELS)}.",
                field="timing",
            )
        if self.timing == "interleaved" and self.backend != "local":
            raise ConfigError(
                f"{TIMING_LABELS['interleaved']} timing needs the {BACKEND_KINDS['local']}: "
                "a server generates on its own schedule and cannot take turns. Choose "
                f"{TIMING_LABELS['fair']} or, for servers on two machines, "
                f"{TIMING_LABELS['concurrent']}.",
                field="timing",
            )
        if isinstance(self.runs, bool) or not isinstance(self.runs, int):
            raise ConfigError(f"Runs must be a whole number, got {self.runs!r}.", field="runs")
        if not 1 <= self.runs <= MAX_RUNS:
            raise ConfigError(f"Runs must be from 1 to {MAX_RUNS}, got {self.runs}.", field="runs")
        if self.exact not in EXACT_POLICIES:
            raise ConfigError(
                f"Unknown {EXACTNESS_LABEL.lower()} policy {self.exact!r}; choose "
                f"{_choices(EXACT_LABELS)}.",
                field="exact",
            )
        self.schema()  # a schema that is not a JSON object fails here, before any run
        if self.backend == "url":
            if self.server_kind not in SERVER_KINDS:
                raise ConfigError(
                    f"Unknown server type {self.server_kind!r}; choose {_choices(SERVER_KINDS)}.",
                    field="server_kind",
                )
            if not self.server_url.strip():
                raise ConfigError(
                    "Enter the URL of the running server, for example http://127.0.0.1:8080.",
                    field="server_url",
                )

    def _check_method(self) -> None:
        methods = METHODS_BY_KIND[self.backend]
        backend = BACKEND_KINDS[self.backend]
        if self.method not in METHOD_LABELS:
            raise ConfigError(
                f"Unknown speculative method {self.method!r}; the {backend} runs "
                f"{_choices({m: METHOD_LABELS[m] for m in methods})}.",
                field="method",
            )
        if self.method not in methods:
            raise ConfigError(
                f"{METHOD_LABELS[self.method]} does not run on the {backend}: choose "
                f"{_labels(methods, METHOD_LABELS)} under Speculative method.",
                field="method",
            )
        if self.method == "draft_model" and not (self.draft_model or "").strip():
            raise ConfigError(
                "The Draft model method needs a draft model with the target's vocabulary: "
                "pick one under Draft model in the settings (auto finds one, or choose "
                "among the models that pair with the target), or choose "
                f"{METHOD_LABELS['ngram']}, which needs none.",
                field="draft_model",
            )
        if self.backend == "url" and self.draft_model_used == AUTO_DRAFT:
            raise ConfigError(
                f"Draft model auto picks a model for the {BACKEND_KINDS['local']} and the "
                f"{BACKEND_KINDS['managed']}; a running server drafts with the model it was "
                "started with: name that model, or choose "
                f"{METHOD_LABELS['server']}.",
                field="draft_model",
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
