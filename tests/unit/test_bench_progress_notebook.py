"""In a Jupyter notebook the bench draws a text bar with the time left, not widgets or lines."""

from __future__ import annotations

import io

import pytest

from speculative_llm.bench.progress import PlainProgress, in_notebook, progress

pytest.importorskip("tqdm", reason="tqdm is missing: pip install 'speculative-llm[bench]'")


class KernelStream(io.StringIO):
    """Stands in for ipykernel's ``OutStream``: a stream that is not a terminal."""


KernelStream.__module__ = "ipykernel.iostream"


def test_a_kernel_stream_is_told_from_a_log_file() -> None:
    assert in_notebook(KernelStream())
    assert not in_notebook(io.StringIO())


def test_a_notebook_gets_a_redrawn_bar_with_counts_and_time_left() -> None:
    out = KernelStream()
    with progress(3, True, stream=out) as advance:
        assert advance is not None
        assert not isinstance(advance, PlainProgress)
        for description in ("warm-up none", "qa-1 none", "qa-1 ngram k=5"):
            advance(description)
    drawn = out.getvalue()
    assert "\r" in drawn  # redrawn in place, which a notebook shows as one bar
    last = drawn.rsplit("\r", 1)[-1]
    assert last.startswith("bench: 100%")
    assert "3/3" in last
    assert "<00:00" in last  # elapsed<left: the estimate of the time left
    assert "qa-1 ngram k=5" in last


def test_quiet_draws_nothing_in_a_notebook_either() -> None:
    out = KernelStream()
    with progress(3, False, stream=out) as advance:
        assert advance is None
    assert out.getvalue() == ""
