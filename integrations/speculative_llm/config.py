"""Speculative decoding configuration shared by every backend."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from speculative_llm.drafter_registry import BUILTIN_DRAFTERS, drafter_names
from speculative_llm.errors import ConfigError

__all__ = [
    "DEFAULT_FIXED_DRAFT",
    "DEFAULT_LONGEST_DRAFT",
    "EXACT_POLICIES",
    "LOCAL_METHODS",
    "METHODS",
    "Method",
    "SpecConfig",
    "default_draft_length",
    "local_methods",
]

Method = Literal["none", "draft_model", "ngram", "suffix", "eagle", "eagle3", "mtp", "server"]
"""How draft tokens are proposed.

``none`` is the baseline (no speculation); ``draft_model`` uses a smaller model with
the same vocabulary; ``ngram`` is prompt lookup; ``suffix`` is suffix decoding (Oliaro
et al. 2024: the most frequent continuation in suffix trees over the request and over
earlier outputs, sized by the match length); ``eagle``/``eagle3``/``mtp`` are
served by engines that load such heads; ``server`` means "whatever the server was
started with" (speculation configured at launch, not per request). A drafter registered
with the local engine (``drafter_registry.register_drafter``) adds its own name.
"""

METHODS: tuple[str, ...] = get_args(Method)
LOCAL_METHODS: tuple[str, ...] = ("none", *(entry.name for entry in BUILTIN_DRAFTERS))
"""Methods the in-process engine implements out of the box (its built-in drafters)."""


def local_methods() -> tuple[str, ...]:
    """Methods the in-process engine runs now: ``none`` and every drafter registered."""
    return ("none", *drafter_names())


DEFAULT_LONGEST_DRAFT = 12
"""Longest draft of cost-aware drafting when no ``num_speculative_tokens`` is given: the
engine drafts only the length (0 included) that pays for its verification, so a long
ceiling costs nothing where drafts are rejected and lets copied text run long."""

DEFAULT_FIXED_DRAFT = 5
"""Draft length of fixed drafts (``cost_aware=False``, the start of ``adaptive``, and
servers, which draft a fixed length) when no ``num_speculative_tokens`` is given."""


def default_draft_length(cost_aware: bool) -> int:
    """The draft length k when none is given: the longest cost-aware draft, or a fixed one."""
    return DEFAULT_LONGEST_DRAFT if cost_aware else DEFAULT_FIXED_DRAFT


EXACT_POLICIES: tuple[str, ...] = ("distribution", "bitwise")
"""The in-process engine's exactness policies (``LocalBackend(exact=...)``):
``distribution`` runs every pass at full speed, its output distributed exactly as the
target's; ``bitwise`` keeps greedy output token-identical to the baseline."""


def _suggest(value: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """How a request should be decoded speculatively.

    Args:
        method: The drafting method (one of ``Method``, or the name of a drafter
            registered with the local engine); ``"none"`` is the baseline.
        num_speculative_tokens: Draft length k. Cost-aware (the default): the longest
            draft, ``DEFAULT_LONGEST_DRAFT`` when None. Fixed drafts
            (``cost_aware=False``) and servers: tokens proposed per verify step, and
            ``adaptive``'s starting length; ``DEFAULT_FIXED_DRAFT`` when None.
        draft_model: Hugging Face id, local directory, ``.gguf`` file, packaged
            alias or store name (``ollama:...``, ``lmstudio:...``, ``hf:...``) of the
            draft model; required for ``method="draft_model"``. ``"auto"``: the local
            engine picks the smallest GGUF on this machine with the target's vocabulary.
        ngram_min: Shortest n-gram that prompt lookup tries to match.
        ngram_max: Longest n-gram that prompt lookup tries to match (tried first).
        adaptive: Grow k after a fully accepted step and shrink it after a rejection.
        cost_aware: Local engine: treat k as the longest draft and, before each step,
            draft the length (0 included) with the most expected tokens per second,
            from the request's running acceptance and the measured cost of verifying
            more tokens in one pass (on a CPU, two tokens cost far more than one).
            Output is unchanged; only speed. None (the default): on, whatever the
            method, unless ``adaptive`` chooses k; ``False`` asks for fixed drafts.
            Servers ignore it (they draft a fixed length).
        min_speculative_tokens: Lower bound of k when ``adaptive`` is on.
        max_speculative_tokens: Upper bound of k when ``adaptive`` is on.
        suffix_max_depth: Suffix decoding: longest substring the suffix tries hold; it
            bounds match length plus draft length (vLLM's
            ``suffix_decoding_max_tree_depth``).
        suffix_max_spec_factor: Suffix decoding: draft at most this many tokens per
            matched token (alpha; vLLM's ``suffix_decoding_max_spec_factor``), and never
            more than k.
        suffix_min_token_prob: Suffix decoding: draft a token only while the estimated
            probability of the path (from continuation frequencies) is at least this
            (vLLM's ``suffix_decoding_min_token_prob``).
        suffix_cache_tokens: Suffix decoding, local engine: tokens of earlier outputs
            the backend's global trie keeps (one per model; older outputs are evicted
            in halves); 0 turns the global trie off (on vLLM:
            ``suffix_decoding_max_cached_requests=0``).

    Raises:
        ConfigError: A value is out of range; the message names the field and the fix.
    """

    method: Method | str = "ngram"
    num_speculative_tokens: int | None = None
    draft_model: str | None = None
    ngram_min: int = 1
    ngram_max: int = 3
    adaptive: bool = False
    cost_aware: bool | None = None
    min_speculative_tokens: int = 1
    max_speculative_tokens: int = 16
    suffix_max_depth: int = 24
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    suffix_cache_tokens: int = 32768

    def __post_init__(self) -> None:
        if self.method not in METHODS and self.method not in drafter_names():
            known = tuple(dict.fromkeys((*METHODS, *drafter_names())))
            raise ConfigError(
                f"Unknown speculative method {self.method!r}.{_suggest(str(self.method), known)} "
                f"Choose one of: {', '.join(known)}.",
                field="method",
            )
        if self.num_speculative_tokens is not None and (
            isinstance(self.num_speculative_tokens, bool)
            or not isinstance(self.num_speculative_tokens, int)
        ):
            raise ConfigError(
                f"num_speculative_tokens must be an integer or None (the default draft "
                f"length), got {self.num_speculative_tokens!r}.",
                field="num_speculative_tokens",
            )
        if self.cost_aware is not None and not isinstance(self.cost_aware, bool):
            raise ConfigError(
                f"cost_aware must be True, False or None (on unless adaptive), got "
                f"{self.cost_aware!r}.",
                field="cost_aware",
            )
        for name in (
            "ngram_min",
            "ngram_max",
            "suffix_max_depth",
            "suffix_cache_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {value!r}.", field=name)
        self._check_suffix()
        if (
            self.speculative
            and self.method != "server"
            and self.num_speculative_tokens is not None
            and self.num_speculative_tokens < 1
        ):
            raise ConfigError(
                f"num_speculative_tokens must be >= 1 with method {self.method!r}, got "
                f"{self.num_speculative_tokens}. Use method='none' to turn speculation off.",
                field="num_speculative_tokens",
            )
        if self.method == "draft_model" and not self.draft_model:
            raise ConfigError(
                "method='draft_model' needs draft_model: a Hugging Face id, a local directory, a "
                ".gguf file or a packaged alias with the target's vocabulary (for example "
                "'HuggingFaceTB/SmolLM2-135M-Instruct' for a SmolLM2-360M target). Without a draft "
                "model, use method='ngram'.",
                field="draft_model",
            )
        if self.ngram_min < 1 or self.ngram_max < self.ngram_min:
            raise ConfigError(
                f"Need 1 <= ngram_min <= ngram_max, got ngram_min={self.ngram_min}, "
                f"ngram_max={self.ngram_max}.",
                field="ngram_min" if self.ngram_min < 1 else "ngram_max",
            )
        if self.min_speculative_tokens < 1 or (
            self.max_speculative_tokens < self.min_speculative_tokens
        ):
            raise ConfigError(
                "Need 1 <= min_speculative_tokens <= max_speculative_tokens, got "
                f"{self.min_speculative_tokens} and {self.max_speculative_tokens}.",
                field="max_speculative_tokens",
            )
        if self.adaptive and self.cost_aware:
            raise ConfigError(
                "adaptive and cost_aware both choose the draft length: set only one "
                "(cost_aware uses num_speculative_tokens as the longest draft).",
                field="cost_aware",
            )
        if self.adaptive and not (
            self.min_speculative_tokens <= self.draft_length <= self.max_speculative_tokens
        ):
            raise ConfigError(
                f"With adaptive=True, num_speculative_tokens ({self.draft_length}) must "
                f"lie within [{self.min_speculative_tokens}, {self.max_speculative_tokens}].",
                field="num_speculative_tokens",
            )

    def _check_suffix(self) -> None:
        if self.suffix_max_depth < 2:
            raise ConfigError(
                f"suffix_max_depth must be >= 2 (match plus draft length), got "
                f"{self.suffix_max_depth}; vLLM's default is 24.",
                field="suffix_max_depth",
            )
        if self.suffix_cache_tokens < 0:
            raise ConfigError(
                f"suffix_cache_tokens must be >= 0 (0 turns the global trie off), got "
                f"{self.suffix_cache_tokens}.",
                field="suffix_cache_tokens",
            )
        for name, low, high in (
            ("suffix_max_spec_factor", 0.0, None),
            ("suffix_min_token_prob", 0.0, 1.0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{name} must be a number, got {value!r}.", field=name)
            if (
                value < low
                or (high is not None and value > high)
                or (name == "suffix_max_spec_factor" and value == 0)
            ):
                bounds = "> 0" if high is None else f"within [{low}, {high}]"
                raise ConfigError(f"{name} must be {bounds}, got {value}.", field=name)

    @property
    def speculative(self) -> bool:
        """Whether this configuration drafts tokens at all."""
        return self.method != "none"

    @property
    def is_cost_aware(self) -> bool:
        """Whether the local engine chooses each draft's length by what it pays.

        ``cost_aware`` as given, or, when None, on unless ``adaptive`` chooses k.
        """
        if self.cost_aware is None:
            return not self.adaptive
        return self.cost_aware

    @property
    def draft_length(self) -> int:
        """The local engine's k: the longest draft when cost-aware, else the fixed one."""
        if self.num_speculative_tokens is not None:
            return self.num_speculative_tokens
        return default_draft_length(self.is_cost_aware)

    @property
    def fixed_draft_length(self) -> int:
        """The k of an engine that drafts a fixed length (servers ignore ``cost_aware``)."""
        if self.num_speculative_tokens is not None:
            return self.num_speculative_tokens
        return default_draft_length(cost_aware=False)

    @classmethod
    def baseline(cls) -> SpecConfig:
        """The same request without speculation (``method="none"``)."""
        return cls(method="none")

    @classmethod
    def from_value(cls, value: SpecConfig | Mapping[str, Any] | str | None) -> SpecConfig | None:
        """Build a config from a ``SpecConfig``, a dict, a method name or ``None``.

        Raises:
            ConfigError: Unknown keys (with a suggestion) or invalid values.
        """
        if value is None or isinstance(value, SpecConfig):
            return value
        if isinstance(value, str):
            return cls(method=value)  # type: ignore[arg-type]
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"speculative must be a SpecConfig, a dict or a method name, got "
                f"{type(value).__name__}.",
                field="speculative",
            )
        known = tuple(f.name for f in dataclasses.fields(cls))
        aliases = {"k": "num_speculative_tokens", "draft": "draft_model"}
        kwargs: dict[str, Any] = {}
        for key, item in value.items():
            name = aliases.get(key, key)
            if name not in known:
                raise ConfigError(
                    f"Unknown speculative option {key!r}.{_suggest(key, known)} "
                    f"Known options: {', '.join(known)}.",
                    field=key,
                )
            kwargs[name] = item
        return cls(**kwargs)

    def replace(self, **changes: Any) -> SpecConfig:
        """Return a copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a JSON-compatible dict."""
        return dataclasses.asdict(self)
