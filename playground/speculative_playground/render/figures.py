"""How the page writes a figure: a number, a share, a duration, or a dash for none."""

from __future__ import annotations

__all__ = ["DASH", "format_number", "percent", "seconds"]

DASH = "—"
"""What the page shows for a figure nobody reported."""


def format_number(value: float | int | None, spec: str = ".2f", suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or a dash when it is unknown."""
    if value is None:
        return DASH
    return f"{value:{spec}}{suffix}"


def percent(value: float | None) -> str:
    """A share as a whole percentage (``0.5`` -> ``50%``), or a dash."""
    return DASH if value is None else f"{value:.0%}"


def seconds(value: float | None) -> str:
    """A duration in milliseconds below a second, else in seconds; or a dash."""
    if value is None:
        return DASH
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
