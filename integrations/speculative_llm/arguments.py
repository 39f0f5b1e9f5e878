"""Checks of the arguments a user gives a framework adapter's constructor and calls.

LangChain and LlamaIndex models are pydantic models that would ignore a misspelt keyword;
both adapters call ``reject_unknown_arguments`` so that one raises ``ConfigError`` naming
it (with the closest known name) instead. A value of the wrong type would raise pydantic's
``ValidationError``; ``config_error_from`` turns it into the documented ``ConfigError``.
Per-call keyword arguments the adapters do not map (``invoke(..., min_p=0.05)``) go to the
server's request body; ``reject_misspelt_call_arguments`` refuses those that misspell a
mapped one (``temprature``).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from speculative_llm.errors import ConfigError

__all__ = [
    "config_error_from",
    "extra_body_of",
    "reject_misspelt_call_arguments",
    "reject_unknown_arguments",
]


def _nearest_hint(name: str, known: Collection[str]) -> str:
    """`` Did you mean 'x'?`` for the known name closest to ``name``, or nothing."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


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
    hint = _nearest_hint(first, known)
    raise ConfigError(
        f"Unknown parameter(s) {', '.join(repr(u) for u in unknown)} for {model.__name__}.{hint} "
        "Backend-specific options go in backend_options={...}.",
        field=first,
    )


def reject_misspelt_call_arguments(
    given: Iterable[str], known: Collection[str], *, where: str, cutoff: float = 0.85
) -> None:
    """Raise ``ConfigError`` for a per-call keyword argument that misspells a known one.

    Adapters send per-call arguments they do not map to the server's request body, as
    ``ChatOpenAI`` and LlamaIndex's ``OpenAI`` do; a name within ``cutoff`` (difflib's
    ratio) of one they map is a typo (``temprature``) rather than a server field, and is
    refused instead of being sent. Server fields such as ``min_p`` (0.6 from ``top_p``)
    pass.

    Args:
        given: The keyword arguments the adapter does not map.
        known: The names it maps.
        where: What was called, for the message (``ChatSpeculative``).
        cutoff: Similarity from which a name is taken for a misspelling.

    Raises:
        ConfigError: The first misspelt argument is ``field``; the message names the
            known one and ``extra_body`` for a server field that happens to look alike.
    """
    for name in sorted(given):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff)
        if close:
            raise ConfigError(
                f"Unknown argument {name!r} for {where}. Did you mean {close[0]!r}? A field "
                f"the server should receive under that name goes in extra_body={{{name!r}: ...}}.",
                field=name,
            )


def extra_body_of(value: object) -> dict[str, Any]:
    """The ``extra_body`` of a call as a dict (fields sent to the server unchanged).

    Raises:
        ConfigError: ``extra_body`` is not a mapping of field names to values.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            f"extra_body must be a dict of request fields, got {value!r}.", field="extra_body"
        )
    return dict(value)


def config_error_from(error: ValidationError, model: type[BaseModel]) -> ConfigError:
    """The ``ConfigError`` for pydantic's ``ValidationError`` of ``model``'s constructor.

    It names the first offending field, the value given and what pydantic expected.
    """
    problems = error.errors(include_url=False)
    if not problems:
        return ConfigError(f"Invalid arguments for {model.__name__}: {error}")
    first = problems[0]
    field = str(first["loc"][0]) if first["loc"] else "value"
    given = first["input"]
    expected = first["msg"].rstrip(".")
    more = f" ({len(problems) - 1} more invalid values)" if len(problems) > 1 else ""
    return ConfigError(
        f"Invalid {field} for {model.__name__}: got {given!r}; {expected[:1].lower()}"
        f"{expected[1:]}.{more}",
        field=field,
    )
