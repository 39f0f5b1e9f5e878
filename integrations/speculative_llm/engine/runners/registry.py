"""The runners of the local engine, by name: one loader each, imported when first asked for.

A loader says which models its runner runs, checks the runner's own options and loads a
model as a ``LoadedModel``. ``models.loading.load_model`` picks one by name (or, for
``runner="auto"``, the first built-in whose ``runs_by_default`` says yes) and passes it
the options that are its own. Adding a runner is one module with a loader plus one entry
in ``BUILTIN_RUNNERS`` (or a ``register_runner`` call); see docs/contributing.md.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.runners.base import LoadedModel
from speculative_llm.errors import ConfigError

__all__ = [
    "BUILTIN_RUNNERS",
    "RunnerLoader",
    "register_runner",
    "runner_loader",
    "runner_names",
]


@runtime_checkable
class RunnerLoader(Protocol):
    """How one runner loads models.

    Attributes:
        name: What ``runner=`` takes (``llamacpp``).
        label: The runner's name for people (``llama.cpp``), in messages.
        options: The runner's own options and their defaults: ``load_model`` passes the
            ones given to ``load``, and refuses them (at other than their default) for
            other runners.
    """

    name: str
    label: str
    options: Mapping[str, object]

    def refusal(self, source: ModelSource, device: str) -> ConfigError | None:
        """Why this runner cannot run the model on ``device`` (None: it can)."""
        ...

    def runs_by_default(self, source: ModelSource, device: str) -> bool:
        """Whether ``runner="auto"`` should pick this runner for the model."""
        ...

    def load(
        self,
        source: ModelSource,
        *,
        device: str,
        dtype: Any,
        threads: int | None,
        **options: Any,
    ) -> LoadedModel:
        """Load the model and its tokenizer (``options``: some of ``self.options``)."""
        ...

    def load_vocabulary(self, source: ModelSource) -> Tokenizer:
        """The model's tokenizer without its weights (for vocabulary checks)."""
        ...


BUILTIN_RUNNERS: dict[str, str] = {
    "llamacpp": "speculative_llm.engine.runners.llama_cpp.loader:LOADER",
    "transformers": "speculative_llm.engine.runners.transformers.loader:LOADER",
}
"""The built-in runners' loaders (``"module:attribute"``), in the order ``auto`` asks them."""

_registered: dict[str, RunnerLoader | str] = {}
_loaded: dict[str, RunnerLoader] = {}


def register_runner(name: str, loader: RunnerLoader | str) -> None:
    """Register a runner's loader (an object or a ``"module:attribute"`` path)."""
    _registered[name] = loader
    _loaded.pop(name, None)


def runner_names() -> tuple[str, ...]:
    """Every runner ``runner=`` takes: the built-in ones, then the registered ones."""
    return tuple(dict.fromkeys([*BUILTIN_RUNNERS, *_registered]))


def runner_loader(name: str) -> RunnerLoader:
    """The loader of runner ``name``.

    Raises:
        ConfigError: No runner has that name (the message lists the known ones).
    """
    known = _loaded.get(name)
    if known is not None:
        return known
    where = _registered.get(name, BUILTIN_RUNNERS.get(name))
    if where is None:
        choices = ("auto", *runner_names())
        close = difflib.get_close_matches(name, choices, n=1) if isinstance(name, str) else []
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"Unknown runner {name!r}.{hint} Use one of {', '.join(choices)}.", field="runner"
        )
    if isinstance(where, str):
        module_name, _, attribute = where.partition(":")
        loader: RunnerLoader = getattr(importlib.import_module(module_name), attribute)
    else:
        loader = where
    _loaded[name] = loader
    return loader
