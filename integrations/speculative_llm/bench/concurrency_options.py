"""Options of the concurrency benchmark: the levels of N and what each run measures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speculative_llm.bench.concurrency_driver import DRIVERS
from speculative_llm.bench.options import BenchOptions, parse_positive_ints
from speculative_llm.errors import ConfigError

__all__ = ["DEFAULT_LEVELS", "ConcurrencyOptions", "parse_levels"]

DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8)
"""Clients at once, by default."""


def parse_levels(value: str) -> tuple[int, ...]:
    """Parse ``1,2,4,8`` into concurrency levels (sorted, duplicates dropped).

    Raises:
        ConfigError: A value that is not an integer >= 1, or none at all.
    """
    levels = parse_positive_ints(
        value, what="Concurrency levels", example="1,2,4,8", field="concurrency"
    )
    return tuple(sorted(set(levels)))


@dataclass(frozen=True, slots=True)
class ConcurrencyOptions:
    """Options of a concurrency run.

    Args:
        bench: What the run shares with ``speculative-llm bench``: ``model``,
            ``threads`` (both sides), prompts (``categories``, ``per_category``,
            ``prompts_file``), ``max_tokens``, ``repeats`` (the rounds), ``warmup``,
            ``progress``, and for ``llama_server_ngram`` the ``llama_server_types`` and
            ``ks``. Its backend must be ``local``.
        levels: Clients at once (N).
        requests_per_client: Requests each client sends, back to back, at the largest
            level; every level serves the same requests (``phase_prompts``), so at a
            level of N clients each sends ``largest / N`` times as many.
        drivers: How our engine is driven: ``threads`` (``generate`` from a thread per
            client, as LangChain's ``batch``) and/or ``asyncio`` (``agenerate`` from a
            task per client, as ``abatch``). llama-server is always driven by threads.
        llama_server_ngram: Add llama-servers with each n-gram type of
            ``bench.llama_server_types`` at each of ``bench.ks``.
        slot_context: Context of each llama-server slot (its ``--ctx-size`` is
            ``slot_context × N``, shared by N slots), and of each sequence of ours
            (``context_window``).
        serial: Add ``ours serial baseline`` and ``ours serial default``: the engine one
            request at a time (``max_batch=1``) at every level.

    Raises:
        ConfigError: Inconsistent options; the message says which and how to fix them.
    """

    bench: BenchOptions = field(default_factory=BenchOptions)
    levels: tuple[int, ...] = DEFAULT_LEVELS
    requests_per_client: int = 2
    drivers: tuple[str, ...] = ("threads",)
    llama_server_ngram: bool = False
    slot_context: int = 4096
    serial: bool = False

    def __post_init__(self) -> None:
        if self.bench.backend != "local":
            raise ConfigError(
                "The concurrency benchmark compares the local engine with llama-servers it "
                f"starts itself; leave out --backend (got {self.bench.backend!r}).",
                field="backend",
            )
        if self.bench.compare_transformers:
            raise ConfigError(
                "--compare-transformers has no part in the concurrency benchmark (transformers' "
                "generate serves one request at a time in this process); leave it out.",
                field="compare_transformers",
            )
        if not self.levels or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.levels
        ):
            raise ConfigError(
                f"Concurrency levels are integers >= 1, like 1,2,4,8; got {self.levels}.",
                field="concurrency",
            )
        object.__setattr__(self, "levels", tuple(sorted(set(self.levels))))
        for name in ("requests_per_client", "slot_context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}.", field=name)
        unknown = [d for d in self.drivers if d not in DRIVERS]
        if unknown or not self.drivers:
            raise ConfigError(
                f"Unknown driver(s) {', '.join(unknown) or repr(self.drivers)}; use "
                f"{' and/or '.join(DRIVERS)}.",
                field="drivers",
            )

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-compatible dict."""
        return {
            "bench": self.bench.to_dict(),
            "levels": list(self.levels),
            "requests_per_client": self.requests_per_client,
            "drivers": list(self.drivers),
            "llama_server_ngram": self.llama_server_ngram,
            "slot_context": self.slot_context,
            "serial": self.serial,
        }
