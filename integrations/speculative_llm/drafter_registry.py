"""The local engine's drafters, by name: one entry each, its module imported when first used.

A drafter is one module (its ``Drafter`` and a factory that builds it for a request)
plus one entry here. Everything that lists speculative methods for the in-process engine
reads this registry: ``SpecConfig`` accepts an entry's name as a method,
``speculative-llm generate --method`` offers it, the playground lists it for the local
engine, and ``LocalBackend`` builds it for each request through the factory. A drafter
that lives in another package registers itself with ``register_drafter`` (see
docs/contributing.md, "Adding a drafter").

This module imports nothing heavy: the configuration and the command line read it
without the ``local`` extra installed.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speculative_llm.errors import ConfigError

__all__ = [
    "BUILTIN_DRAFTERS",
    "DrafterEntry",
    "drafter_entries",
    "drafter_entry",
    "drafter_factory",
    "drafter_names",
    "register_drafter",
]


@dataclass(frozen=True, slots=True)
class DrafterEntry:
    """One drafter of the local engine.

    Attributes:
        name: Its method name (``SpecConfig.method``, ``--method``).
        label: Its name for people (the playground's method picker, messages).
        factory: ``"module:attribute"`` of its factory, imported when first used: called
            as ``factory(spec, host)`` with the request's ``SpecConfig`` and the backend's
            ``DrafterHost``, it returns the request's ``Drafter``.
        summary: One line on what it drafts from (``--help``).
        needs_draft_model: Whether it drafts with ``SpecConfig.draft_model``.
    """

    name: str
    label: str
    factory: str
    summary: str = ""
    needs_draft_model: bool = False


BUILTIN_DRAFTERS: tuple[DrafterEntry, ...] = (
    DrafterEntry(
        "ngram",
        "Prompt lookup (n-gram)",
        "speculative_llm.engine.drafters.ngram:build_prompt_lookup",
        "prompt lookup: what followed an earlier occurrence of the last n tokens",
    ),
    DrafterEntry(
        "suffix",
        "Suffix decoding",
        "speculative_llm.engine.drafters.suffix:build_suffix_drafter",
        "suffix decoding over the prompt and the outputs before it in this process",
    ),
    DrafterEntry(
        "draft_model",
        "Draft model",
        "speculative_llm.engine.drafters.draft_model:build_draft_model",
        "a smaller model with the target's vocabulary (--draft)",
        needs_draft_model=True,
    ),
)
"""The built-in drafters, in the order lists show them."""

_registered: dict[str, DrafterEntry] = {}
_factories: dict[str, Callable[..., Any]] = {}


def register_drafter(entry: DrafterEntry) -> None:
    """Add a drafter (or replace one of the same name)."""
    _registered[entry.name] = entry
    _factories.pop(entry.name, None)


def drafter_entries() -> tuple[DrafterEntry, ...]:
    """Every drafter: the built-in ones, then the registered ones.

    A registered drafter of a built-in's name takes its place.
    """
    entries = {entry.name: entry for entry in BUILTIN_DRAFTERS}
    entries.update(_registered)
    return tuple(entries.values())


def drafter_names() -> tuple[str, ...]:
    """The method names of every drafter (``drafter_entries`` order)."""
    return tuple(entry.name for entry in drafter_entries())


def drafter_entry(name: str) -> DrafterEntry:
    """The entry of drafter ``name``.

    Raises:
        ConfigError: No drafter has that name (the message lists the known ones).
    """
    for entry in drafter_entries():
        if entry.name == name:
            return entry
    names = drafter_names()
    close = difflib.get_close_matches(name, names, n=1) if isinstance(name, str) else []
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"The local engine has no drafter {name!r}.{hint} Its methods: none, {', '.join(names)}.",
        field="method",
    )


def drafter_factory(name: str) -> Callable[..., Any]:
    """The factory of drafter ``name``, its module imported on first use.

    Raises:
        ConfigError: No drafter has that name.
    """
    factory = _factories.get(name)
    if factory is None:
        module_name, _, attribute = drafter_entry(name).factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
        _factories[name] = factory
    return factory
