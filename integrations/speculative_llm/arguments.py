"""Checks of the arguments a user gives a framework adapter's constructor and calls.

LangChain and LlamaIndex models are pydantic models that would ignore a misspelt keyword;
both adapters call ``reject_unknown_arguments`` so that one raises ``ConfigError`` naming
it (with the closest known name) instead. A value of the wrong type would raise pydantic's
``ValidationError``; ``config_error_from`` turns it into the documented ``ConfigError``.
Per-call keyword arguments the adapters do not map (``invoke(..., min_p=0.05)``) go to the
server's request body (``request_body``), after the model's own body fields, which
``reject_own_parameters`` keeps from naming a parameter the adapter maps;
``reject_misspelt_call_arguments`` refuses a call argument that misspells a mapped one
(``temprature``).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from speculative_llm.errors import ConfigError

__all__ = [
    "MISSPELLING_CUTOFF",
    "config_error_from",
    "extra_body_of",
    "reject_misspelt_call_arguments",
    "reject_own_parameters",
    "reject_unknown_arguments",
    "request_body",
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


MISSPELLING_CUTOFF = 0.85
"""difflib's ratio from which an unmapped call argument is taken for a misspelt mapped one
(``temprature``: 0.95 from ``temperature``); server fields such as ``min_p`` (0.6 from
``top_p``) stay below it."""


def reject_misspelt_call_arguments(
    given: Iterable[str], known: Collection[str], *, where: str
) -> None:
    """Raise ``ConfigError`` for a per-call keyword argument that misspells a known one.

    Adapters send per-call arguments they do not map to the server's request body, as
    ``ChatOpenAI`` and LlamaIndex's ``OpenAI`` do; a name within ``MISSPELLING_CUTOFF``
    (difflib's ratio) of one they map is a typo (``temprature``) rather than a server
    field, and is refused instead of being sent.

    Args:
        given: The keyword arguments the adapter does not map.
        known: The names it maps.
        where: What was called, for the message (``ChatSpeculative``).

    Raises:
        ConfigError: The first misspelt argument is ``field``; the message names the
            known one and ``extra_body`` for a server field that happens to look alike.
    """
    for name in sorted(given):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=MISSPELLING_CUTOFF)
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


def request_body(
    call_kwargs: Mapping[str, Any],
    mapped: Collection[str],
    model_fields: Mapping[str, Any],
    *,
    where: str,
) -> dict[str, Any]:
    """A call's request-body fields, ordered as ``ChatOpenAI`` and LlamaIndex's ``OpenAI``.

    ``model_fields`` (``model_kwargs``, ``additional_kwargs``), then the call's keyword
    arguments outside ``mapped``, then its ``extra_body``, each winning over the one
    before.

    Raises:
        ConfigError: A call argument misspells a mapped one, or ``extra_body`` is not a
            dict of field names.
    """
    unmapped = {name: value for name, value in call_kwargs.items() if name not in mapped}
    reject_misspelt_call_arguments(unmapped, mapped, where=where)
    return {**model_fields, **unmapped, **extra_body_of(call_kwargs.get("extra_body"))}


def reject_own_parameters(
    fields: Iterable[str], own: Collection[str], *, argument: str, where: str
) -> None:
    """Refuse model-level body fields that name a parameter the adapter takes itself.

    As ``ChatOpenAI`` refuses ``model_kwargs={"temperature": ...}``: such a value belongs
    in its own argument, where it is checked and traced.

    Raises:
        ConfigError: ``argument`` (``model_kwargs``, ``additional_kwargs``) names one of
            ``own``; the message says which and how to pass it.
    """
    named = sorted(name for name in fields if name in own)
    if named:
        raise ConfigError(
            f"{argument} holds {', '.join(repr(k) for k in named)}, which {where} takes as "
            f"its own parameter(s): pass {named[0]}=... directly. {argument} is for fields "
            f"{where} does not name (min_p, parallel_tool_calls...).",
            field=argument,
        )


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
