"""Checks of the arguments a user gives a framework adapter's constructor.

LangChain and LlamaIndex models are pydantic models that would ignore a misspelt keyword;
both adapters call ``reject_unknown_arguments`` so that one raises ``ConfigError`` naming
it (with the closest known name) instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import BaseModel

from speculative_llm.errors import ConfigError

__all__ = ["reject_unknown_arguments"]


def reject_unknown_arguments(model: type[BaseModel], given: Iterable[str]) -> None:
    """Raise ``ConfigError`` for an argument that is not a field (or alias) of ``model``.

    Raises:
        ConfigError: The first unknown argument is ``field``; the message lists them all
            and suggests the closest field name.
    """
    known: set[str] = set()
    for name, field in model.model_fields.items():
        known.add(name)
        if field.alias:
            known.add(field.alias)
    unknown = sorted(set(given) - known)
    if not unknown:
        return
    first = unknown[0]
    close = difflib.get_close_matches(first, sorted(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"Unknown parameter(s) {', '.join(repr(u) for u in unknown)} for {model.__name__}.{hint} "
        "Backend-specific options go in backend_options={...}.",
        field=first,
    )
