"""The bench's progress on stderr: a line with an estimate of the time left, off when quiet."""

from __future__ import annotations

import io

from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.progress import PlainProgress, format_duration, progress
from speculative_llm.cli import build_parser
from speculative_llm.commands.bench import options_from_args


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_read_as_seconds_minutes_or_hours() -> None:
    assert format_duration(4.4) == "4s"
    assert format_duration(185) == "3m05s"
    assert format_duration(3720) == "1h02m"
    assert format_duration(-1) == "0s"


def test_plain_lines_come_every_interval_with_an_estimate_and_at_the_end() -> None:
    clock, out = FakeClock(), io.StringIO()
    line = PlainProgress(4, out, clock=clock, interval_s=30.0)
    clock.now += 10.0
    line("warm-up ngram k=5")  # the first generation prints: the run is alive
    clock.now += 10.0
    line("qa-1 none")  # 10 s after the last line: not yet
    clock.now += 25.0
    line("qa-1 ngram k=5")  # 35 s after: due
    clock.now += 1.0
    line("qa-2 none")  # the last one always prints
    assert out.getvalue().splitlines() == [
        "bench 1/4 (25%), 10s elapsed, about 30s left: warm-up ngram k=5",
        "bench 3/4 (75%), 45s elapsed, about 15s left: qa-1 ngram k=5",
        "bench 4/4 (100%), 46s elapsed: qa-2 none",
    ]


def test_progress_is_plain_lines_off_a_terminal_and_nothing_when_quiet() -> None:
    out = io.StringIO()  # not a terminal: no bar that redraws
    with progress(3, True, stream=out) as advance:
        assert isinstance(advance, PlainProgress)
        advance("qa-1 none")
    assert out.getvalue().startswith("bench 1/3 (33%)")
    with progress(3, False, stream=out) as advance:
        assert advance is None


def test_quiet_turns_progress_off() -> None:
    def parsed(*argv: str) -> BenchOptions:
        options: BenchOptions = options_from_args(build_parser().parse_args(["bench", *argv]))
        return options

    assert parsed().progress is True
    assert parsed("--quiet").progress is False
    assert parsed("-q").progress is False
    assert parsed("--no-progress").progress is False
