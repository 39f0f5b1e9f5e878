"""Progress of a long benchmark on stderr, with an estimate of the time left.

On a terminal, a rich progress bar (description, bar, done of total, elapsed, time
left). In a Jupyter notebook, a tqdm text bar: the notebook redraws it in place, and a
saved notebook keeps its last state as plain text (no widget). Elsewhere (a log file, a
pipe) a bar cannot redraw, so a plain line every ``PLAIN_INTERVAL_S`` seconds and at the
end::

    bench 12/340 (4%), 1m20s elapsed, about 36m left: qa-3 ngram k=12

The estimate assumes the generations left take as long as those done, on average.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = [
    "PLAIN_INTERVAL_S",
    "PlainProgress",
    "StepCallback",
    "format_duration",
    "in_notebook",
    "progress",
]

StepCallback = Callable[[str], None]
"""Called after each generation (warm-up included) with a short description."""

PLAIN_INTERVAL_S = 30.0
"""Seconds between two plain progress lines (the last generation always prints)."""


def format_duration(seconds: float) -> str:
    """``45s``, ``3m05s`` or ``1h02m``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class PlainProgress:
    """A progress callback that writes a line at most every ``interval_s`` seconds.

    Args:
        total: Generations the run will make.
        stream: Where the lines go (stderr).
        clock: Time source (``time.monotonic``).
        interval_s: Least seconds between two lines; the last generation always prints.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = PLAIN_INTERVAL_S,
    ) -> None:
        self._total = max(total, 1)
        self._stream = stream
        self._clock = clock
        self._interval_s = interval_s
        self._started = clock()
        self._printed_at: float | None = None
        self.done = 0

    def line(self, description: str, now: float) -> str:
        """The line for ``done`` generations finished at ``now``."""
        elapsed = now - self._started
        head = (
            f"bench {self.done}/{self._total} ({self.done / self._total:.0%}), "
            f"{format_duration(elapsed)} elapsed"
        )
        left = self._total - self.done
        if left > 0 and self.done > 0:
            head += f", about {format_duration(elapsed / self.done * left)} left"
        return f"{head}: {description}"

    def __call__(self, description: str) -> None:
        """Count one generation done; print a line when one is due."""
        self.done += 1
        now = self._clock()
        due = self._printed_at is None or now - self._printed_at >= self._interval_s
        if due or self.done >= self._total:
            print(self.line(description, now), file=self._stream, flush=True)
            self._printed_at = now


@contextlib.contextmanager
def _rich_bar(total: int) -> Iterator[StepCallback]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("bench", total=total)

        def advance(description: str) -> None:
            bar.update(task, advance=1, description=description)

        yield advance


def in_notebook(stream: TextIO) -> bool:
    """Whether ``stream`` is a Jupyter kernel's output stream, where a text bar redraws."""
    return type(stream).__module__.startswith("ipykernel.")


@contextlib.contextmanager
def _notebook_bar(total: int, stream: TextIO) -> Iterator[StepCallback]:
    # tqdm's plain-text bar, not tqdm.notebook's widget: widget state does not survive
    # in a saved notebook, text does.
    from tqdm import tqdm

    with tqdm(total=total, desc="bench", unit="gen", file=stream, mininterval=1.0) as bar:

        def advance(description: str) -> None:
            bar.set_postfix_str(description, refresh=False)
            bar.update(1)

        yield advance


@contextlib.contextmanager
def progress(
    total: int, enabled: bool, *, stream: TextIO | None = None
) -> Iterator[StepCallback | None]:
    """A progress callback for ``total`` generations (None when not ``enabled``).

    A rich bar where ``stream`` (stderr by default) is a terminal, a tqdm text bar in a
    Jupyter notebook (plain lines when tqdm is missing), plain lines elsewhere.
    """
    if not enabled:
        yield None
        return
    out = sys.stderr if stream is None else stream
    if out.isatty():
        with _rich_bar(total) as advance:
            yield advance
        return
    if in_notebook(out) and importlib.util.find_spec("tqdm") is not None:
        with _notebook_bar(total, out) as advance:
            yield advance
        return
    yield PlainProgress(total, out)
