"""A long prompt in chunks: progress reports, cancellation between chunks, the refusal.

The engine's loop on a fake runner that records its passes (no model), then
``LocalBackend`` on the tiny models of both runners.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from counting_runner import CountingRunner  # noqa: E402
from local_runners import RUNNERS, require_llama_cpp  # noqa: E402
from speculative_llm import (  # noqa: E402
    Cancellation,
    Chunk,
    Completion,
    ConfigError,
    GenerationCancelledError,
    GenerationRequest,
    cancellable,
)
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy  # noqa: E402
from speculative_llm.engine.loop.engine import (  # noqa: E402
    StepResult,
    generate_steps,
    prefill,
    prefill_in_chunks,
    prompt_passes,
)
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.runners.base import (  # noqa: E402
    PromptChunks,
    Runner,
    check_prompt_fits,
)
from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib  # noqa: E402
from speculative_llm.types import PromptProgress  # noqa: E402

VOCAB = 50
GREEDY = SamplingParams(0.0, 1.0, 0)


class RecordingRunner(CountingRunner):
    """A ``CountingRunner`` that takes long prompts in chunks (``PromptChunks``).

    ``during_feed`` runs in the middle of each ``feed`` (another thread's cancel, say),
    which then asks its ``cancelled`` as llama.cpp asks between the graph's operations.
    """

    def __init__(self, chunk_tokens: int) -> None:
        super().__init__(VOCAB)
        self.prompt_chunk_tokens = chunk_tokens
        self.during_feed: Callable[[], None] | None = None

    def feed(self, tokens: list[int], cancelled: Callable[[], bool] | None = None) -> None:
        self.passes.append(("feed", len(tokens)))
        if self.during_feed is not None:
            self.during_feed()
        if cancelled is not None and cancelled():
            raise GenerationCancelledError("cancelled in the middle of a pass")
        self.cached.extend(tokens)


def _steps(runner: Runner, prompt: list[int], **options: Any) -> Any:
    return generate_steps(
        runner,
        None,
        prompt,
        max_new_tokens=3,
        params=GREEDY,
        draft_length=DraftLengthPolicy(0),
        **options,
    )


def test_the_fake_runner_takes_prompt_chunks() -> None:
    assert isinstance(RecordingRunner(4), PromptChunks)
    assert isinstance(RecordingRunner(4), Runner)


def test_no_pass_of_a_chunked_prompt_is_shorter_than_a_chunk() -> None:
    assert prompt_passes(13, 4) == [5, 4, 4]  # the first pass takes the remainder
    assert prompt_passes(12, 4) == [4, 4, 4]
    assert prompt_passes(7, 4) == [7]  # under two chunks: one pass
    assert prompt_passes(7, None) == [7]
    for count in range(1, 300):
        passes = prompt_passes(count, 64)
        assert sum(passes) == count
        assert len(passes) == 1 or min(passes) >= 64


def test_a_long_prompt_is_fed_in_chunks_with_a_report_after_each() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    prompt = list(range(1, 14))  # 13 tokens: passes of 5 and 4, then 4 with the logits
    items = list(_steps(runner, prompt, report_prompt=True))
    reports = [item for item in items if isinstance(item, PromptProgress)]
    steps = [item for item in items if isinstance(item, StepResult)]
    assert [(r.done, r.total, r.cached) for r in reports] == [(5, 13, 0), (9, 13, 0)]
    assert all(r.elapsed_s >= 0 for r in reports)
    assert items[:2] == reports  # every report comes before the first token
    assert runner.passes[:3] == [("feed", 5), ("feed", 4), ("forward", 4)]
    assert [step.tokens for step in steps] == [[14], [15], [16]]
    assert steps[0].prefill


def test_without_report_prompt_the_chunks_are_passes_but_no_items() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    items = list(_steps(runner, list(range(1, 14))))
    assert all(isinstance(item, StepResult) for item in items)
    assert runner.passes[:3] == [("feed", 5), ("feed", 4), ("forward", 4)]


def test_a_prompt_of_one_chunk_gets_no_report() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    chunks = prefill_in_chunks(runner, [1, 2, 3, 4, 5, 6, 7], GREEDY, None)
    with pytest.raises(StopIteration) as finished:
        next(chunks)
    assert finished.value.value.tokens == [8]
    assert runner.passes == [("forward", 7)]


def test_closing_at_a_report_stops_the_prefill_between_chunks() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    steps = _steps(runner, list(range(1, 41)), report_prompt=True)
    first = next(steps)
    assert isinstance(first, PromptProgress) and first.done == 4
    steps.close()
    # One chunk computed, none after the cancellation, no first token.
    assert runner.passes == [("feed", 4)]
    assert runner.length == 4


def test_a_cancellation_stops_the_prefill_between_chunks() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    stop = Cancellation()
    steps = _steps(runner, list(range(1, 41)), report_prompt=True, cancellation=stop)
    assert isinstance(next(steps), PromptProgress)
    stop.cancel()
    with pytest.raises(GenerationCancelledError):
        next(steps)
    assert runner.passes == [("feed", 4)]  # no pass after the cancellation


def test_a_cancellation_stops_the_chunk_in_flight() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    stop = Cancellation()
    steps = _steps(runner, list(range(1, 41)), report_prompt=True, cancellation=stop)
    assert isinstance(next(steps), PromptProgress)
    runner.during_feed = stop.cancel  # cancelled while the second chunk computes
    with pytest.raises(GenerationCancelledError):
        next(steps)
    assert runner.passes == [("feed", 4), ("feed", 4)]
    assert runner.length == 4  # the stopped chunk left nothing in the cache


def test_a_cancellation_stops_decoding_between_steps() -> None:
    runner = RecordingRunner(chunk_tokens=4)
    stop = Cancellation()
    steps = _steps(runner, [1, 2, 3], cancellation=stop)
    assert next(steps).tokens == [4]
    stop.cancel()
    with pytest.raises(GenerationCancelledError):
        next(steps)
    assert runner.passes == [("forward", 3)]


def test_prefill_computes_the_same_passes_as_the_reported_prefill() -> None:
    reported, plain = RecordingRunner(chunk_tokens=3), RecordingRunner(chunk_tokens=3)
    prompt = list(range(1, 12))
    items = list(prefill_in_chunks(reported, prompt, GREEDY, None))
    first = prefill(plain, prompt, GREEDY, None)
    assert len(items) == 2  # after 5 and 8 tokens
    assert plain.passes == reported.passes == [("feed", 5), ("feed", 3), ("forward", 3)]
    assert first.tokens == [12] and plain.cached == reported.cached


class CachingRunner(RecordingRunner):
    """A ``RecordingRunner`` that keeps a shared prefix (``PrefixReuse``)."""

    @property
    def cached_tokens(self) -> list[int]:
        return self.cached

    def restart_from(self, length: int) -> None:
        del self.cached[length:]


def test_reports_count_the_cached_prefix_as_done_and_time_only_the_rest() -> None:
    runner = CachingRunner(chunk_tokens=4)
    runner.cached = list(range(1, 7))  # the previous request's prompt
    prompt = list(range(1, 20))  # 13 tokens past the cached 6
    chunks = prefill_in_chunks(runner, prompt, GREEDY, None, reuse_prefix=True)
    reports = []
    while True:
        try:
            reports.append(next(chunks))
        except StopIteration as finished:
            first = finished.value
            break
    assert [(r.done, r.cached) for r in reports] == [(11, 6), (15, 6)]
    assert runner.passes == [("feed", 5), ("feed", 4), ("forward", 4)]
    assert first.cached_prompt_tokens == 6


def test_progress_estimates_the_time_left_from_the_rate_so_far() -> None:
    progress = PromptProgress(done=1024, total=4349, elapsed_s=8.0, cached=0)
    assert progress.tokens_per_second == 128.0
    assert progress.remaining_s == pytest.approx((4349 - 1024) / 128.0)
    # Only computed tokens count towards the rate: a cached prefix took no time.
    cached = PromptProgress(done=600, total=1000, elapsed_s=1.0, cached=500)
    assert cached.tokens_per_second == 100.0
    assert PromptProgress(done=500, total=1000, elapsed_s=0.0, cached=500).remaining_s is None


def test_a_prompt_that_fills_the_window_is_refused_with_its_count_and_the_window() -> None:
    with pytest.raises(ConfigError, match=r"9,120 tokens.*context window of 8,192") as caught:
        check_prompt_fits(9120, 8192)
    assert caught.value.field == "prompt"
    check_prompt_fits(8191, 8192)
    check_prompt_fits(10**6, None)
    runner = RecordingRunner(chunk_tokens=4)
    with pytest.raises(ConfigError, match="context window of 8 tokens"):
        next(_steps(runner, list(range(1, 9)), max_length=8, report_prompt=True))
    assert runner.passes == []  # refused before any pass


def test_progress_chunks_are_no_part_of_a_completion() -> None:
    progress = Chunk(prompt_progress=PromptProgress(done=64, total=200, elapsed_s=0.4))
    assert progress.is_progress and not Chunk(text="a").is_progress
    completion = Completion.from_chunks(
        [progress, Chunk(text="Hi", final=True, finish_reason="stop")], backend="local"
    )
    assert completion.text == "Hi" and completion.finish_reason == "stop"


# ---- LocalBackend on the tiny models -------------------------------------------------------

LONG_PROMPT = " ".join(f"def f{n}(a, b):\n    return a + b + {n}\n" for n in range(12))
"""About 400 tokens of the tiny models' character vocabulary: several chunks."""
VERY_LONG_PROMPT = LONG_PROMPT * 4
"""About 1,600 tokens (of a 2,048-token window): a close after the first report comes
long before the engine, which runs ahead of its reader, could reach the prompt's end."""


@pytest.fixture(scope="module", params=RUNNERS)
def tiny_backend(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Any:
    """The tiny target on each runner (llama.cpp under ``exact="bitwise"``)."""
    from speculative_llm.backends.local import LocalBackend

    if request.param == "llamacpp":
        require_llama_cpp()
        gguf = request.getfixturevalue("tiny_gguf")
        local = LocalBackend(str(gguf), runner="llamacpp", threads=1, exact="bitwise")
    else:
        local = LocalBackend(str(tiny_model_dir), runner="transformers", dtype="float32")
    yield local
    local.close()


def _request(**changes: Any) -> GenerationRequest:
    return GenerationRequest(prompt=LONG_PROMPT, max_tokens=12, **changes)


def test_a_long_prompt_streams_its_progress_before_the_first_token(tiny_backend: Any) -> None:
    prompt_tokens = len(tiny_backend.encode_prompt(_request()))
    runner = tiny_backend.engine.runner
    default = runner.prompt_chunk_tokens  # llama.cpp's: its batch of 512
    chunk = runner.prompt_chunk_tokens = 128
    assert prompt_tokens > 2 * chunk, "the test prompt must take several chunks"
    try:
        chunks = list(tiny_backend.stream(_request()))
    finally:
        runner.prompt_chunk_tokens = default
    reports = [c.prompt_progress for c in chunks if c.prompt_progress is not None]
    passes = prompt_passes(prompt_tokens, chunk)
    assert [r.done for r in reports] == [sum(passes[: i + 1]) for i in range(len(passes) - 1)]
    assert all(r.total == prompt_tokens for r in reports)
    first_text = next(i for i, c in enumerate(chunks) if c.tokens)
    assert all(c.is_progress for c in chunks[:first_text])
    assert all(not (c.text or c.tokens or c.stats or c.final) for c in chunks[:first_text])
    assert chunks[-1].final
    # generate() leaves the reports out.
    assert tiny_backend.generate(_request()).text == "".join(c.text for c in chunks)


def test_chunked_and_whole_prefill_give_the_same_greedy_text(tiny_backend: Any) -> None:
    runner = tiny_backend.engine.runner
    chunked = tiny_backend.generate(_request()).text
    chunk = runner.prompt_chunk_tokens
    try:
        runner.prompt_chunk_tokens = 10**6  # the whole prompt in one pass
        whole = tiny_backend.generate(_request()).text
    finally:
        runner.prompt_chunk_tokens = chunk
    assert chunked == whole


def test_closing_a_stream_at_a_report_stops_the_engine_before_the_prompt_ends(
    tiny_backend: Any,
) -> None:
    stream = tiny_backend.stream(GenerationRequest(prompt=VERY_LONG_PROMPT, max_tokens=4))
    first = next(stream)
    assert first.is_progress
    stream.close()  # returns once the engine is free
    runner = tiny_backend.engine.runner
    assert runner.length < first.prompt_progress.total
    # The engine serves the next request as usual.
    assert tiny_backend.generate(GenerationRequest(prompt="def add(a, b):", max_tokens=4)).text


def test_a_chunk_in_flight_asks_whether_it_is_cancelled(
    tiny_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runner = tiny_backend.engine.runner
    tokens = tiny_backend.encode_prompt(_request())
    asked = 0

    def cancelled_once_started() -> bool:
        nonlocal asked
        asked += 1
        return asked > 1  # no before the pass, yes once it runs

    runner.reset()
    runner.feed(tokens[:64])
    if tiny_backend.runner_name == "transformers":
        # A transformers pass runs to its end once started: it asks before.
        runner.feed(tokens[64:128], cancelled_once_started)
        assert asked == 1 and runner.length == 128
    else:
        with (
            caplog.at_level(logging.DEBUG, logger=llama_cpp_lib.logger.name),
            pytest.raises(GenerationCancelledError),
        ):
            runner.feed(tokens[64:128], cancelled_once_started)
        assert asked > 1  # llama.cpp asked while the pass ran
        # llama.cpp reports the abort as errors: a Stop asked for it, so no warning.
        reports = [record for record in caplog.records if "failed" in record.getMessage()]
        assert reports and all(record.levelno == logging.DEBUG for record in reports)
        assert runner.length == 64 and len(runner.cached_tokens) == 64
    runner.reset()


def test_a_cancelled_scope_stops_the_stream_during_the_prompt(tiny_backend: Any) -> None:
    stop = Cancellation()
    with cancellable(stop):
        stream = tiny_backend.stream(GenerationRequest(prompt=VERY_LONG_PROMPT, max_tokens=4))
    first = next(stream)  # the engine read the scope when the stream opened
    assert first.is_progress
    stop.cancel()
    with pytest.raises(GenerationCancelledError):
        for chunk in stream:
            assert chunk.is_progress  # at most the reports already on their way
    assert tiny_backend.engine.runner.length < first.prompt_progress.total
    assert tiny_backend.generate(GenerationRequest(prompt="def add(a, b):", max_tokens=4)).text


def test_a_prompt_longer_than_the_window_is_refused_when_the_stream_opens(
    tiny_backend: Any,
) -> None:
    window = tiny_backend.model_info().context_window
    if window is None:
        pytest.skip("this runner's model states no context window")
    words = " ".join(["a"] * (window + 10))
    with pytest.raises(ConfigError, match="context window of") as caught:
        tiny_backend.stream(GenerationRequest(prompt=words, max_tokens=4))  # no next()
    assert caught.value.field == "prompt"
