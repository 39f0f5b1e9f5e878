"""Speculative decoding configuration shared by every backend."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from speculative_llm.errors import ConfigError

__all__ = ["EXACT_POLICIES", "LOCAL_METHODS", "METHODS", "Method", "SpecConfig"]

Method = Literal["none", "draft_model", "ngram", "eagle", "eagle3", "mtp", "server"]
"""How draft tokens are proposed.

``none`` is the baseline (no speculation); ``draft_model`` uses a smaller model with
the same vocabulary; ``ngram`` is prompt lookup; ``eagle``/``eagle3``/``mtp`` are
served by engines that load such heads; ``server`` means "whatever the server was
started with" (speculation configured at launch, not per request).
"""

METHODS: tuple[str, ...] = get_args(Method)
LOCAL_METHODS: tuple[str, ...] = ("none", "draft_model", "ngram")
"""Methods the in-process engine implements."""

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
        method: The drafting method; ``"none"`` is the baseline.
        num_speculative_tokens: Draft length k: tokens proposed per verify step
            (the starting length when ``adaptive`` is on).
        draft_model: Hugging Face id, local directory, ``.gguf`` file or packaged
            alias of the draft model; required for ``method="draft_model"``.
        ngram_min: Shortest n-gram that prompt lookup tries to match.
        ngram_max: Longest n-gram that prompt lookup tries to match (tried first).
        adaptive: Grow k after a fully accepted step and shrink it after a rejection.
        cost_aware: Local engine: treat k as the longest draft and, before each step,
            draft the length (0 included) with the most expected tokens per second,
            from the request's running acceptance and the measured cost of verifying
            more tokens in one pass (on a CPU, two tokens cost far more than one).
            Output is unchanged; only speed. Servers ignore it.
        min_speculative_tokens: Lower bound of k when ``adaptive`` is on.
        max_speculative_tokens: Upper bound of k when ``adaptive`` is on.

    Raises:
        ConfigError: A value is out of range; the message names the field and the fix.
    """

    method: Method = "ngram"
    num_speculative_tokens: int = 5
    draft_model: str | None = None
    ngram_min: int = 1
    ngram_max: int = 3
    adaptive: bool = False
    cost_aware: bool = False
    min_speculative_tokens: int = 1
    max_speculative_tokens: int = 16

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(
                f"Unknown speculative method {self.method!r}.{_suggest(str(self.method), METHODS)} "
                f"Choose one of: {', '.join(METHODS)}.",
                field="method",
            )
        for name in ("num_speculative_tokens", "ngram_min", "ngram_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {value!r}.", field=name)
        if self.speculative and self.method != "server" and self.num_speculative_tokens < 1:
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
            self.min_speculative_tokens
            <= self.num_speculative_tokens
            <= self.max_speculative_tokens
        ):
            raise ConfigError(
                f"With adaptive=True, num_speculative_tokens ({self.num_speculative_tokens}) must "
                f"lie within [{self.min_speculative_tokens}, {self.max_speculative_tokens}].",
                field="num_speculative_tokens",
            )

    @property
    def speculative(self) -> bool:
        """Whether this configuration drafts tokens at all."""
        return self.method != "none"

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
