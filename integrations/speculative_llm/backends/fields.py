"""Parsers of the numbers engines put in their answers, shared by every backend.

Engines send counts and durations as JSON numbers, sometimes as integral floats
(``12.0``), sometimes null, and a buggy or older build may send a string, a boolean or
a negative value. Each parser returns the value in our terms, or None when the field is
absent or unusable: a figure that cannot be read is unknown, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speculative_llm.types import Usage

__all__ = [
    "count",
    "counts",
    "first_present",
    "header_count",
    "non_negative",
    "seconds_from_ms",
    "usage_of",
]


def count(value: object) -> int | None:
    """A token or step count: a non-negative integer (``12.0`` counts as 12).

    Example:
        >>> count(12.0), count(-1), count(True), count("3")
        (12, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    number = int(value)
    return number if number >= 0 else None


def counts(value: object) -> list[int] | None:
    """A list of counts (a histogram, per-step figures); None if any entry is unusable."""
    if not isinstance(value, list):
        return None
    items = [count(item) for item in value]
    if any(item is None for item in items):
        return None
    return [item for item in items if item is not None]


def non_negative(value: object) -> float | None:
    """A non-negative number (seconds, a rate); NaN and negatives are unknown."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and number >= 0 else None  # NaN != NaN


def seconds_from_ms(value: object) -> float | None:
    """Milliseconds (llama-server ``timings``, vLLM ``metrics``) as seconds."""
    milliseconds = non_negative(value)
    return None if milliseconds is None else milliseconds / 1000.0


def header_count(headers: Mapping[str, str], name: str) -> int | None:
    """A count sent as an HTTP header (TGI's ``x-generated-tokens``...)."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def first_present(fields: Mapping[str, Any], *names: str) -> object:
    """The value of the first of ``names`` that is present and not null.

    Engines rename fields and keep the old name as an alias for a release or two:
    pass the current name first, then the older ones.
    """
    for name in names:
        value = fields.get(name)
        if value is not None:
            return value
    return None


def usage_of(prompt_tokens: object, completion_tokens: object) -> Usage | None:
    """Token usage from two counts; None when neither is known."""
    prompt, completion = count(prompt_tokens), count(completion_tokens)
    if prompt is None and completion is None:
        return None
    return Usage(prompt_tokens=prompt or 0, completion_tokens=completion or 0)
