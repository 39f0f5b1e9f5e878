"""What a benchmark run measures: backend, model, methods, draft lengths, prompts, repeats."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speculative_llm.bench.agent_tasks import (
    AGENT_FRAMEWORKS,
    AGENT_MAX_TOKENS,
    AGENT_QUESTIONS,
    parse_frameworks,
)
from speculative_llm.bench.predictions import profile_to_dict
from speculative_llm.bench.records import OURS, Variant
from speculative_llm.config import default_draft_length
from speculative_llm.errors import ConfigError
from speculative_llm.prediction import HARDWARE_PROFILES, HardwareProfile

__all__ = [
    "BENCH_METHODS",
    "LLAMA_SERVER_ENGINE",
    "LLAMA_SERVER_NGRAM_TYPES",
    "PEER_ENGINE",
    "QUICK",
    "BenchOptions",
    "parse_ks",
    "parse_methods",
    "parse_positive_ints",
]

BENCH_METHODS: tuple[str, ...] = ("none", "ngram", "suffix", "draft_model", "server")
"""Methods a benchmark can ask for; ``server`` is whatever a running server was started
with (one variant, k decided by the server)."""

PEER_ENGINE = "transformers"
"""Engine name of transformers' own generation, the peer of ``--compare-transformers``."""

LLAMA_SERVER_ENGINE = "llama-server"
"""Engine name of the managed llama-servers of ``--compare-llama-server``."""

LLAMA_SERVER_NGRAM_TYPES: tuple[str, ...] = ("ngram-simple", "ngram-mod")
"""llama-server's n-gram ``--spec-type``s that ``--compare-llama-server`` runs, each at
every k: the comparison takes the best of them per category."""

QUICK: dict[str, Any] = {"per_category": 1, "max_tokens": 48, "repeats": 2, "agent_questions": 2}
"""What ``--quick`` sets (one prompt per category, short answers, two repeats, two agent
questions per framework), unless the user gives those options explicitly."""


def parse_methods(value: str) -> tuple[str, ...]:
    """Parse ``none,ngram,draft_model`` into a tuple (duplicates dropped).

    Raises:
        ConfigError: An unknown method.
    """
    methods = tuple(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown or not methods:
        raise ConfigError(
            f"Unknown benchmark method(s) {', '.join(unknown) or repr(value)}; use a "
            f"comma-separated list of {', '.join(BENCH_METHODS)}.",
            field="methods",
        )
    return methods


def parse_positive_ints(value: str, *, what: str, example: str, field: str) -> list[int]:
    """Parse a comma-separated list of integers >= 1 (``3,5,8``), in order, empty items skipped.

    Args:
        value: The list as given.
        what: What the integers are, for the error (``Draft lengths``).
        example: A valid list, for the error (``3,5,8``).
        field: The option named in the ``ConfigError``.

    Raises:
        ConfigError: A value that is not an integer >= 1, or none at all.
    """
    numbers: list[int] = []
    for item in value.split(","):
        if not item.strip():
            continue
        try:
            number = int(item)
        except ValueError:
            number = 0
        if number < 1:
            raise ConfigError(
                f"{what} are integers >= 1, like {example}; got {item.strip()!r} in {value!r}.",
                field=field,
            )
        numbers.append(number)
    if not numbers:
        raise ConfigError(
            f"No {what.lower()} in {value!r}; pass a list like {example}.", field=field
        )
    return numbers


def parse_ks(value: str) -> tuple[int, ...]:
    """Parse ``3,5,8`` into draft lengths (duplicates dropped, in order).

    Raises:
        ConfigError: A value is not an integer >= 1, or there is none.
    """
    return tuple(
        dict.fromkeys(parse_positive_ints(value, what="Draft lengths", example="3,5,8", field="k"))
    )


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Options of one benchmark run.

    Args:
        backend: ``local`` (the in-process engine), ``llamacpp`` or any registered HTTP
            backend.
        model: Target model. ``local``: alias, ``.gguf``, directory or hub id (default
            ``smollm2-135m``). ``llamacpp`` without ``base_url``: the ``.gguf`` or alias
            the managed llama-servers load (default ``smollm2-135m``). HTTP backends: the
            model name sent with requests.
        draft_model: Draft model for ``draft_model``.
        base_url: URL of a running server (HTTP backends). Without it, ``llamacpp``
            starts one managed llama-server per variant.
        baseline_url: URL of a second server started without speculation, for HTTP
            backends that cannot switch speculation off per request.
        methods: Methods to compare; the baseline ``none`` is always run.
        ks: Draft lengths; each speculative method runs once per k (empty: the
            drafting policy's default, ``config.default_draft_length(cost_aware)``).
        categories: ``all`` or category names.
        prompts_file: A JSONL prompt file instead of the built-in set.
        per_category: Most prompts per category (None: all).
        repeats: Timed repeats per (variant, prompt); the median is reported.
        max_tokens: Generation budget per prompt.
        warmup: Run every variant once, untimed, before measuring.
        compare_transformers: Add transformers' ``generate`` on the same model and
            prompts: plain greedy, ``prompt_lookup_num_tokens=k`` and ``assistant_model=``.
        compare_llama_server: Add managed llama-servers on the same GGUF, prompts and
            threads (local backend only): plain, and each of ``llama_server_types`` at
            every k.
        llama_server_types: llama-server n-gram spec types for ``compare_llama_server``.
        runner: The local engine's runner: ``auto``, ``llamacpp`` or ``transformers``.
        cost_aware: Our speculative variants use ``SpecConfig(cost_aware=True)`` (the
            default): k is the longest draft and the local engine drafts only what pays
            for itself; False drafts k tokens whenever it can.
        dtype: Weight dtype of in-process models (``auto``, ``float32``, ``bfloat16``).
        device: Torch device of in-process models.
        threads: Threads of in-process models (torch) and of managed llama-servers
            (None: their defaults).
        exact: The local engine's exactness policy: ``distribution`` or ``bitwise``.
        progress: Show progress on stderr: a bar with an estimate of the time left on a
            terminal, a plain line every half minute otherwise.
        agent_frameworks: Frameworks whose real agents answer the ``agent_loop``
            category's sessions (``langchain``: ``create_agent``; ``llama_index``:
            ``FunctionAgent``); empty for none.
        agent_questions: Questions each framework's agent answers, in sequence.
        agent_max_tokens: Generation budget of each model call of an agent session.
        profiles: The user's own machines to predict each cell's speedup on, besides
            the built-in ``HARDWARE_PROFILES`` (``--profile NAME=TG,PP[,BATCH]``, see
            ``bench.predictions.parse_profile``).

    Raises:
        ConfigError: Inconsistent options; the message says which and how to fix them.
    """

    backend: str = "local"
    model: str | None = None
    draft_model: str | None = None
    base_url: str | None = None
    baseline_url: str | None = None
    methods: tuple[str, ...] = ("none", "ngram")
    ks: tuple[int, ...] = ()
    categories: str | tuple[str, ...] = "all"
    prompts_file: Path | None = None
    per_category: int | None = None
    repeats: int = 3
    max_tokens: int = 128
    warmup: bool = True
    compare_transformers: bool = False
    compare_llama_server: bool = False
    llama_server_types: tuple[str, ...] = LLAMA_SERVER_NGRAM_TYPES
    runner: str = "auto"
    cost_aware: bool = True
    dtype: str = "auto"
    device: str = "cpu"
    threads: int | None = None
    exact: str = "distribution"
    progress: bool = True
    agent_frameworks: tuple[str, ...] = AGENT_FRAMEWORKS
    agent_questions: int = 3
    agent_max_tokens: int = AGENT_MAX_TOKENS
    profiles: tuple[HardwareProfile, ...] = ()

    def __post_init__(self) -> None:
        # Checked first: the names are normalised in place (llama-index -> llama_index).
        object.__setattr__(self, "agent_frameworks", parse_frameworks(self.agent_frameworks))
        unknown = [m for m in self.methods if m not in BENCH_METHODS]
        if unknown:
            raise ConfigError(
                f"Unknown benchmark method(s) {', '.join(unknown)}; use "
                f"{', '.join(BENCH_METHODS)}.",
                field="methods",
            )
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.ks):
            raise ConfigError(f"Draft lengths must be integers >= 1, got {self.ks}.", field="k")
        if not self.ks:
            object.__setattr__(self, "ks", (default_draft_length(self.cost_aware),))
        for name in ("repeats", "max_tokens", "agent_questions", "agent_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}.", field=name)
        if self.agent_questions > len(AGENT_QUESTIONS):
            raise ConfigError(
                f"agent_questions must be at most {len(AGENT_QUESTIONS)} (the built-in "
                f"questions), got {self.agent_questions}.",
                field="agent_questions",
            )
        if self.per_category is not None and self.per_category < 1:
            raise ConfigError(
                f"per_category must be >= 1, got {self.per_category}.", field="per_category"
            )
        if "draft_model" in self.methods and not self.draft_model:
            raise ConfigError(
                "Method draft_model needs a draft model: pass --draft (a model with the "
                "target's vocabulary; the target itself works for a mechanics check), or drop "
                "draft_model from --methods.",
                field="draft_model",
            )
        if self.backend == "local":
            if "server" in self.methods:
                raise ConfigError(
                    "Method 'server' means a server's own configuration; the local engine takes "
                    "none, ngram, suffix or draft_model.",
                    field="methods",
                )
            if self.base_url or self.baseline_url:
                raise ConfigError(
                    "--base-url/--baseline-url are for server backends; the local engine runs "
                    "in this process (choose --backend llamacpp, vllm... for a server).",
                    field="base_url",
                )
        elif self.base_url is None and self.backend not in (
            "llamacpp",
            "llama-server",
            "llama.cpp",
        ):
            raise ConfigError(
                f"Backend {self.backend!r} needs --base-url (the URL of a running server). "
                "Only llamacpp can start its own servers.",
                field="base_url",
            )
        if self.compare_llama_server and self.backend != "local":
            raise ConfigError(
                "--compare-llama-server sets llama-servers beside the local engine; with "
                f"--backend {self.backend} use --backend llamacpp to measure llama-server alone.",
                field="compare_llama_server",
            )
        unknown_types = [t for t in self.llama_server_types if not t.startswith("ngram-")]
        if unknown_types:
            raise ConfigError(
                f"llama-server n-gram types look like ngram-simple or ngram-mod; got "
                f"{', '.join(unknown_types)}.",
                field="llama_server_types",
            )
        if self.runner not in ("auto", "llamacpp", "transformers"):
            raise ConfigError(
                f"Unknown runner {self.runner!r}; use auto, llamacpp or transformers.",
                field="runner",
            )
        self._check_profiles()
        if self.compare_transformers and self.base_url is not None and not self.model:
            raise ConfigError(
                "--compare-transformers loads the model in this process: pass --model with a "
                "name transformers can load (a packaged alias, .gguf file, directory or hub id).",
                field="model",
            )

    def _check_profiles(self) -> None:
        """The user's profiles are profiles, each with a name of its own."""
        taken = {profile.name for profile in HARDWARE_PROFILES}
        for profile in self.profiles:
            if not isinstance(profile, HardwareProfile):
                raise ConfigError(
                    f"profiles holds HardwareProfile objects, got {profile!r}; build one with "
                    "bench.predictions.parse_profile('NAME=TG,PP').",
                    field="profile",
                )
            if profile.name in taken:
                builtin = profile.name in {p.name for p in HARDWARE_PROFILES}
                raise ConfigError(
                    f"Profile name {profile.name!r} is "
                    + ("a built-in profile's" if builtin else "given twice")
                    + "; give each --profile a name of its own.",
                    field="profile",
                )
            taken.add(profile.name)

    @property
    def managed_servers(self) -> bool:
        """Whether the benchmark starts its own llama-servers (llamacpp without a URL)."""
        return self.backend in ("llamacpp", "llama-server", "llama.cpp") and self.base_url is None

    def variants(self) -> list[Variant]:
        """The variants to run, baselines first: ours, then transformers' when compared."""
        speculative = [m for m in self.methods if m != "none"]
        ours = [Variant(OURS, "none")]
        for method in speculative:
            if method == "server":
                ours.append(Variant(OURS, "server"))
            else:
                ours.extend(Variant(OURS, method, k) for k in self.ks)
        peers: list[Variant] = []
        if self.compare_transformers:
            peers.append(Variant(PEER_ENGINE, "none"))
            for method in speculative:
                if method in ("ngram", "draft_model"):
                    peers.extend(Variant(PEER_ENGINE, method, k) for k in self.ks)
        if self.compare_llama_server:
            peers.append(Variant(LLAMA_SERVER_ENGINE, "none"))
            if "ngram" in speculative:
                peers.extend(
                    Variant(LLAMA_SERVER_ENGINE, spec_type, k)
                    for spec_type in self.llama_server_types
                    for k in self.ks
                )
        return ours + peers

    def replace(self, **changes: Any) -> BenchOptions:
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-compatible dict."""
        record = dataclasses.asdict(self)
        record["prompts_file"] = None if self.prompts_file is None else str(self.prompts_file)
        record["methods"] = list(self.methods)
        record["ks"] = list(self.ks)
        record["llama_server_types"] = list(self.llama_server_types)
        record["agent_frameworks"] = list(self.agent_frameworks)
        record["profiles"] = [profile_to_dict(profile) for profile in self.profiles]
        if not isinstance(self.categories, str):
            record["categories"] = list(self.categories)
        return record
