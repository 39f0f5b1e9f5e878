"""What a ``LocalBackend`` keeps for its drafters across requests (``DrafterHost``).

Drafters are built for each request by their registry entry's factory
(``drafter_registry``), which ``drafter_for`` calls; what outlives a request lives here,
keyed by what the drafter asks for: draft models, loaded once per name with a runner of
their own, and the state a drafter keeps between requests (suffix decoding's global trie
of earlier outputs). The backend knows none of it by kind.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from speculative_llm.config import SpecConfig
from speculative_llm.drafter_registry import drafter_factory
from speculative_llm.engine.drafters.base import Drafter
from speculative_llm.engine.drafters.vocabulary import check_draft_vocabulary
from speculative_llm.engine.models.draft_choice import AUTO_DRAFT, pick_draft_model
from speculative_llm.engine.models.loading import load_model
from speculative_llm.engine.models.sources import resolve_model
from speculative_llm.engine.runners.base import LoadedModel, Runner
from speculative_llm.errors import ConfigError

__all__ = ["BackendDrafterHost"]

_T = TypeVar("_T")


class BackendDrafterHost:
    """The ``DrafterHost`` of one backend: its draft models and its drafters' kept state.

    Args:
        target: The backend's target model (a draft model of the same files shares its
            weights).
        vocab_size: Width of the target runner's logit rows.
        load_options: ``load_model`` options draft models load with (device, dtype,
            threads, progress).
        lock: The backend's loading lock (loads and first uses wait for each other).
    """

    def __init__(
        self,
        target: LoadedModel,
        vocab_size: int,
        load_options: dict[str, Any],
        lock: threading.Lock,
    ) -> None:
        self._target = target
        self._vocab_size = vocab_size
        self._options = load_options
        self._lock = lock
        self._drafts: dict[str, tuple[LoadedModel, Runner]] = {}
        self._kept: dict[Hashable, Any] = {}

    @property
    def vocab_size(self) -> int:
        """Width of the target's logit rows."""
        return self._vocab_size

    def drafter_for(self, spec: SpecConfig) -> Drafter | None:
        """A request's drafter, built by its registry entry's factory (None: the baseline).

        Raises:
            ConfigError: An unknown method, or a drafter that cannot be built (a draft
                model that cannot be loaded).
            VocabularyMismatchError: The draft model's vocabulary differs from the target's.
        """
        if not spec.speculative:
            return None
        drafter: Drafter = drafter_factory(spec.method)(spec, self)
        return drafter

    def draft_model(self, name: str) -> tuple[LoadedModel, Runner]:
        """Draft model ``name`` and its runner, loaded on first use.

        ``auto`` picks the smallest GGUF on this machine with the target's vocabulary
        (``engine.models.draft_choice``), once per backend.

        Raises:
            ConfigError: The model cannot be loaded (``field="draft_model"``).
            VocabularyMismatchError: Its vocabulary differs from the target's (or, for
                ``auto``, no model on this machine has it).
        """
        with self._lock:
            known = self._drafts.get(name)
            if known is None:
                try:
                    draft = self._load(name)
                except ConfigError as error:
                    # The draft's file is at fault, not the target's: name the right field.
                    if error.field in (None, "model"):
                        error.field = "draft_model"
                    raise
                known = (draft, draft.new_runner())
                self._drafts[name] = known
            return known

    def _load(self, name: str) -> LoadedModel:
        target = self._target
        progress = bool(self._options.get("progress", True))
        if name == AUTO_DRAFT:
            # Picked from the GGUF headers of the models on this machine (logged too).
            choice = pick_draft_model(target.source)
            if progress:
                print(f"draft_model='auto': {choice.reason}", file=sys.stderr)
            name = choice.name
        # Resolved once (a packaged model is fetched, a derived one made, at most once);
        # the vocabulary check and the load read the same source.
        source = resolve_model(name, progress=progress)
        # Refused from the files' vocabularies before any weight loads.
        check_draft_vocabulary(target, source)
        same_files = (source.location, source.gguf_file) == (
            target.source.location,
            target.source.gguf_file,
        )
        # A model drafting for itself shares its weights (a cache of its own).
        if same_files:
            return target
        return load_model(source, runner=target.runner_name, **self._options)

    def kept(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """The state kept under ``key``, made by ``make`` on first use."""
        with self._lock:
            if key not in self._kept:
                self._kept[key] = make()
            kept: _T = self._kept[key]
            return kept

    def forget(self) -> None:
        """Drop every drafter's kept state (earlier outputs no longer draft)."""
        with self._lock:
            self._kept.clear()

    def close(self) -> None:
        """Close the draft models' runners and the draft models not shared with the target."""
        drafts = list(self._drafts.values())
        self._drafts.clear()
        for draft, runner in drafts:
            runner.close()
            if draft is not self._target:
                draft.close()
