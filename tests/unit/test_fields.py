"""The field parsers every backend reads engine answers with."""

from __future__ import annotations

import math

import pytest

from speculative_llm.backends.fields import (
    count,
    counts,
    first_present,
    header_count,
    non_negative,
    seconds_from_ms,
    usage_of,
)
from speculative_llm.types import Usage


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (12, 12), (12.0, 12), (12.5, None), (-1, None), (True, None), ("3", None)],
)
def test_count_accepts_non_negative_integers_only(value: object, expected: int | None) -> None:
    assert count(value) == expected


def test_counts_refuses_a_list_with_one_unusable_entry() -> None:
    assert counts([0, 2.0, 1]) == [0, 2, 1]
    assert counts([]) == []
    assert counts([1, -1]) is None
    assert counts("1,2") is None


@pytest.mark.parametrize("value", [math.nan, -0.5, False, None, "1"])
def test_unusable_numbers_are_unknown(value: object) -> None:
    assert non_negative(value) is None
    assert seconds_from_ms(value) is None


def test_milliseconds_become_seconds() -> None:
    assert seconds_from_ms(1240.5) == pytest.approx(1.2405)
    assert non_negative(0.11) == 0.11


def test_header_count_parses_integers_and_ignores_the_rest() -> None:
    headers = {"x-generated-tokens": " 17 ", "x-prompt-tokens": "-3", "x-bad": "1.5"}
    assert header_count(headers, "x-generated-tokens") == 17
    assert header_count(headers, "x-prompt-tokens") is None
    assert header_count(headers, "x-bad") is None
    assert header_count(headers, "x-missing") is None


def test_first_present_prefers_the_current_name_over_its_aliases() -> None:
    fields = {"old": 1, "new": None, "newer": 3}
    assert first_present(fields, "newest", "newer", "old") == 3
    assert first_present(fields, "new", "old") == 1
    assert first_present(fields, "missing") is None


def test_usage_of_needs_one_known_count() -> None:
    assert usage_of(7, None) == Usage(prompt_tokens=7, completion_tokens=0)
    assert usage_of(None, "11") is None
