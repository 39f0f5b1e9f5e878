"""Which fast paths a model's runners use: every path tried once per model, and why.

``FastPaths.probe`` asks each path module's ``try_on`` in turn, logs which paths are on
and why the others are off, and is shared by the model's runners; ``fast_paths="off"``
runs the model exactly as transformers does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from speculative_llm.engine.runners.transformers.fast_paths import (
    attention,
    cache,
    head,
    linears,
)
from speculative_llm.engine.runners.transformers.fast_paths.attention import (
    GroupedAttention,
)
from speculative_llm.engine.runners.transformers.fast_paths.head import VocabularyHead
from speculative_llm.engine.runners.transformers.fast_paths.linears import OneDnnLinears
from speculative_llm.engine.runners.transformers.fast_paths.probing import NOT_ASKED

__all__ = ["PATHS", "FastPaths", "FastPathsMode"]

logger = logging.getLogger(__name__)

FastPathsMode = Literal["auto", "off"]
"""``auto``: every fast path whose probe passes; ``off``: transformers' own forward."""

_PATH_MODULES: tuple[ModuleType, ...] = (linears, head, attention, cache)
"""Each path's module (its ``NAME``, ``LABEL`` and ``try_on``), in the order tried."""

PATHS: frozenset[str] = frozenset(module.NAME for module in _PATH_MODULES)
"""The fast paths, by name: ``linears``, ``head``, ``attention``, ``cache``."""

_LABELS: dict[str, str] = {module.NAME: module.LABEL for module in _PATH_MODULES}


@dataclass(slots=True)
class FastPaths:
    """The fast paths a model's runners use, found by one probe at load.

    Attributes:
        head: The decoder and the ``VocabularyHead`` that projects its output, or None.
        linears: The layers routed to oneDNN during passes, or None.
        attention: The attention switch used for passes of several tokens, or None.
        growing_cache: Whether caches use ``GrowingLayer`` (``new_cache``).
        reasons: For each path (by name, as in ``PATHS``), ``on...`` or why it is off.
    """

    head: tuple[Any, VocabularyHead] | None = None
    linears: OneDnnLinears | None = None
    attention: GroupedAttention | None = None
    growing_cache: bool = False
    reasons: dict[str, str] = field(default_factory=dict)

    @classmethod
    def off(cls) -> FastPaths:
        """No fast path: the model runs as transformers runs it."""
        reason = "off (fast_paths='off')"
        return cls(reasons={module.NAME: reason for module in _PATH_MODULES})

    @classmethod
    def probe(
        cls,
        model: Any,
        vocab_size: int,
        mode: FastPathsMode = "auto",
        *,
        only: frozenset[str] = PATHS,
    ) -> FastPaths:
        """Try every fast path on ``model``; log which are on and why the others are off.

        Args:
            model: A causal LM.
            vocab_size: Width of its logits (for the probe inputs).
            mode: ``auto`` or ``off``.
            only: The paths to try, among ``PATHS`` (tests compare one path at a time).

        Raises:
            ValueError: An unknown mode or path.
        """
        if mode not in ("auto", "off"):
            raise ValueError(f"fast_paths must be 'auto' or 'off', got {mode!r}")
        if not only <= PATHS:
            raise ValueError(
                f"unknown fast paths {sorted(only - PATHS)}; choose from {sorted(PATHS)}"
            )
        if mode == "off":
            paths = cls.off()
            logger.info("transformers runner: %s", paths.describe())
            return paths
        handles: dict[str, Any] = {}
        reasons: dict[str, str] = {}
        for module in _PATH_MODULES:
            if module.NAME in only:
                handles[module.NAME], reasons[module.NAME] = module.try_on(model, vocab_size)
            else:
                handles[module.NAME], reasons[module.NAME] = None, NOT_ASKED
        paths = cls(
            head=handles[head.NAME],
            linears=handles[linears.NAME],
            attention=handles[attention.NAME],
            growing_cache=bool(handles[cache.NAME]),
            reasons=reasons,
        )
        paths._share_the_packed_output_weight(model)
        logger.info("transformers runner: %s", paths.describe())
        return paths

    def _share_the_packed_output_weight(self, model: Any) -> None:
        """Let the head project with the output layer's packed copy, when the linears made one.

        That copy exists anyway, and it passed the linears' probe, which ran the whole
        model.
        """
        if self.head is None or self.linears is None or not self.linears.packed:
            return
        output_layer = model.get_output_embeddings()
        if any(layer is output_layer for layer in self.linears.linears):
            decoder, vocabulary_head = self.head
            self.head = (
                decoder,
                VocabularyHead(
                    vocabulary_head.weight, vocabulary_head.bias, packed_from=output_layer
                ),
            )

    def describe(self) -> str:
        """One line: each path and its state."""
        return "fast paths: " + "; ".join(
            f"{_LABELS[name]} {state}" for name, state in self.reasons.items()
        )

    @property
    def names_on(self) -> list[str]:
        """The paths in use, by name (as in ``PATHS``)."""
        return [name for name, state in self.reasons.items() if state.startswith("on")]
