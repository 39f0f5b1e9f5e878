"""Continuous batching in the local engine: exactness per request, reliability, the queue."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="writing tiny GGUF files needs gguf (extra 'transformers')")

from local_runners import require_llama_cpp
from speculative_llm import (
    BackendError,
    ConfigError,
    GenerationCancelledError,
    GenerationRequest,
    SpecConfig,
)
from speculative_llm.backends.local import LocalBackend
from speculative_llm.cancellation import Cancellation, cancellable
from speculative_llm.engine.loop.draft_cost import ALONE, BatchShare
from speculative_llm.engine.loop.session import SpeculationSession
from speculative_llm.engine.scheduler import MAX_BUFFERED_CHUNKS
from speculative_llm.errors import QueueFullError

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "hello world, this is a test of",
    "x = 1\ny = 2\nz = x + y\n",
    "the quick brown fox jumps over the lazy dog; the quick",
    "for i in range(10):\n    print(i)\n",
    "abc abc abc abc",
]
SPECS = {
    "none": SpecConfig.baseline(),
    "ngram": SpecConfig(method="ngram", num_speculative_tokens=4, cost_aware=False),
    "suffix": SpecConfig(method="suffix", num_speculative_tokens=4, cost_aware=False),
}
JOIN_S = 120.0
"""How long a client thread may take before the test calls it stalled (a guard only)."""


def _open(path: Path, **options: Any) -> LocalBackend:
    # Plain Q8_0 weights: rows scored in a batch equal rows scored alone, bitwise, on
    # this fixture (test_llama_cpp_batch), so batched greedy and seeded output can be
    # compared token for token with each request run alone.
    return LocalBackend(
        str(path),
        runner="llamacpp",
        threads=1,
        weight_layout="plain",
        calibrate_costs=False,
        prompt_cache=False,
        context_window=512,
        **options,
    )


@pytest.fixture(scope="module")
def alone(tiny_gguf: Path) -> Iterator[LocalBackend]:
    require_llama_cpp()
    backend = _open(tiny_gguf)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def batched(tiny_gguf: Path) -> Iterator[LocalBackend]:
    require_llama_cpp()
    backend = _open(tiny_gguf, max_batch=4, max_queue=16)
    yield backend
    backend.close()


def _request(prompt: str, spec: str, **changes: Any) -> GenerationRequest:
    fields: dict[str, Any] = {"prompt": prompt, "max_tokens": 24, "spec": SPECS[spec]}
    return GenerationRequest(**{**fields, **changes})


def _concurrently(backend: LocalBackend, requests: list[GenerationRequest]) -> list[str]:
    """The texts of ``requests`` streamed at once, one client thread each."""
    texts: dict[int, str] = {}

    def client(index: int) -> None:
        texts[index] = "".join(chunk.text for chunk in backend.stream(requests[index]))

    threads = [threading.Thread(target=client, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(thread.is_alive() for thread in threads), "a client stalled"
    return [texts.get(index, "<failed>") for index in range(len(requests))]


@pytest.mark.parametrize("spec", list(SPECS))
def test_batched_greedy_text_equals_each_request_alone(
    alone: LocalBackend, batched: LocalBackend, spec: str
) -> None:
    # Each sequence keeps a KV stream of its own, so its rows are its rows alone,
    # bitwise, whatever decodes beside it (on this CPU fixture): the same greedy text.
    requests = [_request(prompt, spec) for prompt in PROMPTS]
    expected = [alone.generate(request).text for request in requests]
    assert _concurrently(batched, requests) == expected


@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_batched_seeded_sampling_equals_each_request_alone(
    alone: LocalBackend, batched: LocalBackend, spec: str
) -> None:
    # Each request accepts and samples with its own random stream, whatever decodes
    # beside it: the same seed gives the same sample as the request alone. Not suffix
    # decoding: its drafts come from what earlier requests taught it, which differs
    # between the two backends, and a sample depends on the drafts it verified.
    requests = [
        _request(prompt, spec, temperature=0.9, seed=seed) for seed, prompt in enumerate(PROMPTS)
    ]
    expected = [alone.generate(request).text for request in requests]
    assert _concurrently(batched, requests) == expected
    assert len(set(expected)) > 1


DIGITS = {
    "type": "json_schema",
    "json_schema": {
        "name": "n",
        "schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
        },
    },
}


def test_each_batched_request_follows_its_own_grammar(
    alone: LocalBackend, batched: LocalBackend
) -> None:
    # Constrained and free requests decode in the same passes: each sequence masks its
    # rows with its own grammar (or none), and every text is the text of its request alone.
    requests = [
        _request(prompt, spec, max_tokens=40, response_format=DIGITS if index % 2 else None)
        for index, (prompt, spec) in enumerate(zip(PROMPTS[:4], ["none", "ngram"] * 2, strict=True))
    ]
    expected = [alone.generate(request).text for request in requests]
    texts = _concurrently(batched, requests)
    assert texts == expected
    for index in (1, 3):
        assert isinstance(json.loads(texts[index])["a"], int), texts[index]


@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_each_batched_pass_is_timed_once_under_its_rows(batched: LocalBackend, spec: str) -> None:
    # The shared cost model must see a batched pass as one pass of all its rows, not as
    # each request's own pass of its rows taking the whole pass's time; a pass whose
    # sequences brought different row counts (drafts) ran as several sub-batches in
    # llama.cpp and is not recorded at all.
    scheduler, cost = batched.engine.scheduler, batched.engine.verify_cost
    assert scheduler is not None
    passes, observed = scheduler.passes, cost.passes
    steps: list[int] = []

    def client(request: GenerationRequest) -> None:
        final = [chunk for chunk in batched.stream(request) if chunk.final][-1]
        assert final.stats is not None and final.stats.verify_steps is not None
        steps.append(final.stats.verify_steps)

    requests = [_request(prompt, spec, max_tokens=12) for prompt in PROMPTS[:4]]
    threads = [threading.Thread(target=client, args=(request,)) for request in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert len(steps) == len(requests), "a client failed or stalled"
    batched_passes = scheduler.passes - passes
    assert batched_passes < sum(steps) - len(requests)  # steps shared passes
    if spec == "none":  # one row each: every pass recorded, once
        assert cost.passes - observed == batched_passes
    else:
        assert cost.passes - observed < batched_passes


def test_sixteen_clients_with_cancellations_all_end(
    alone: LocalBackend, batched: LocalBackend
) -> None:
    """16 threads on a batch of 4: a third cancel, a third stop reading; none is lost.

    The requests that run to the end give their text alone: sequences that come and go
    beside a request (their cells freed and reused) change none of its rows.
    """
    requests = [_request(PROMPTS[index % len(PROMPTS)], "ngram") for index in range(16)]
    outcomes: dict[int, str] = {}
    texts: dict[int, str] = {}

    def client(index: int) -> None:
        stop = Cancellation()
        with cancellable(stop):
            stream = batched.stream(requests[index])
            last = None
            text = ""
            try:
                for count, chunk in enumerate(stream):
                    last = chunk
                    text += chunk.text
                    if index % 3 == 1 and count == 2:
                        stop.cancel()
                    if index % 3 == 2 and count == 3:
                        stream.close()  # type: ignore[attr-defined]
                        outcomes[index] = "closed"
                        return
            except GenerationCancelledError:
                outcomes[index] = "cancelled"
                return
            done = last is not None and last.final and last.finish_reason is not None
            texts[index] = text
            outcomes[index] = "complete" if done else f"ended without a final chunk: {last}"

    threads = [threading.Thread(target=client, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(thread.is_alive() for thread in threads), "a client stalled"
    assert outcomes == {
        index: ("complete", "cancelled", "closed")[index % 3] for index in range(16)
    }
    for index, text in texts.items():
        assert text == alone.generate(requests[index]).text, index
    scheduler = batched.engine.scheduler
    assert scheduler is not None and scheduler.active == 0 and scheduler.waiting == 0
    # The engine serves the next request as before.
    assert batched.generate(requests[0]).finish_reason in ("length", "stop")


def test_a_full_queue_refuses_a_request_and_the_waiting_one_runs(tiny_gguf: Path) -> None:
    require_llama_cpp()
    backend = _open(tiny_gguf, max_batch=2, max_queue=1)
    try:
        running = [backend.stream(_request(prompt, "none")) for prompt in PROMPTS[:2]]
        for stream in running:
            next(stream)  # both take a sequence
        waiting_text: list[str] = []
        waiting = threading.Thread(
            target=lambda: waiting_text.append(backend.generate(_request(PROMPTS[2], "none")).text)
        )
        waiting.start()
        scheduler = backend.engine.scheduler
        assert scheduler is not None
        while scheduler.waiting == 0 and waiting.is_alive():
            waiting.join(0.01)
        with pytest.raises(QueueFullError, match="queue is full"):
            next(backend.stream(_request(PROMPTS[3], "none")))
        for stream in running:
            stream.close()  # type: ignore[attr-defined]
        waiting.join(JOIN_S)
        assert not waiting.is_alive()
        assert waiting_text and waiting_text[0]
    finally:
        backend.close()


def test_a_waiting_request_runs_steps_while_every_running_reader_stalls(
    tiny_gguf: Path,
) -> None:
    # The waiting request's reader runs the steps; once both running requests have
    # their outboxes full, a step has no sequence to decode: it runs no pass (and does
    # not fail the reader that asked), and the waiting request runs once they are read.
    require_llama_cpp()
    backend = _open(tiny_gguf, max_batch=2, max_queue=1)
    try:
        running = [backend.stream(_request(p, "none", max_tokens=40)) for p in PROMPTS[:2]]
        for stream in running:
            next(stream)  # both take a sequence; their readers stop here
        scheduler = backend.engine.scheduler
        assert scheduler is not None
        passes = scheduler.passes
        waiting_outcome: list[str] = []

        def wait_and_read() -> None:
            try:
                output = backend.generate(_request(PROMPTS[2], "none"))
            except Exception as error:  # the assertion below names it
                waiting_outcome.append(repr(error))
            else:
                waiting_outcome.append("complete" if output.text else "empty")

        waiting = threading.Thread(target=wait_and_read)
        waiting.start()
        # The waiting reader runs passes until both outboxes are full, then steps on an
        # empty batch, polling every few milliseconds.
        while waiting.is_alive():
            before = scheduler.passes
            waiting.join(0.25)
            if scheduler.passes == before:
                break
        assert scheduler.passes <= passes + MAX_BUFFERED_CHUNKS  # no pass for stalled readers
        for stream in running:
            assert list(stream)[-1].final
        waiting.join(JOIN_S)
        assert waiting_outcome == ["complete"]
    finally:
        backend.close()


def test_batched_pass_costs_are_timed_between_requests(
    tiny_gguf: Path, alone: LocalBackend
) -> None:
    require_llama_cpp()
    backend = _open(tiny_gguf, max_batch=3)
    try:
        costs = backend.batched_pass_costs()
        assert costs is not None and sorted(costs.ratios) == [2, 3]
        assert costs.one_token_s > 0 and costs.row_cost >= 0
        # Every sequence was reset: the engine serves as before, the text of one alone.
        request = _request(PROMPTS[0], "ngram")
        assert backend.generate(request).text == alone.generate(request).text
        stream = backend.stream(_request(PROMPTS[1], "none"))
        next(stream)
        with pytest.raises(BackendError, match=r"busy.*between requests"):
            backend.batched_pass_costs()
        stream.close()  # type: ignore[attr-defined]
    finally:
        backend.close()
    assert alone.batched_pass_costs() is None  # max_batch=1: nothing batches


def test_each_sequence_may_fill_the_whole_context_window(tiny_gguf: Path) -> None:
    # A window of 512 and four requests of ~15 prompt tokens and 200 more at once: each
    # sequence has a window of its own, not a quarter of one (or a pool that runs out).
    require_llama_cpp()
    backend = _open(tiny_gguf, max_batch=4, max_queue=8)
    try:
        requests = [_request(prompt, "none", max_tokens=200) for prompt in PROMPTS[:4]]
        outputs: list[Any] = []
        threads = [
            threading.Thread(target=lambda r=request: outputs.append(backend.generate(r)))
            for request in requests
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_S)
        assert len(outputs) == len(requests), "a request failed or stalled"
        assert sum(output.stats.generated_tokens for output in outputs) > 512
        scheduler = backend.engine.scheduler
        assert scheduler is not None and scheduler.largest_batch == 4
    finally:
        backend.close()


def test_batching_is_refused_where_it_cannot_run(tiny_gguf: Path, tiny_model_dir: Path) -> None:
    require_llama_cpp()
    with pytest.raises(ConfigError, match="one request at a time"):
        LocalBackend(str(tiny_model_dir), runner="transformers", max_batch=2, calibrate_costs=False)
    with pytest.raises(ConfigError, match="not bitwise exact"):
        _open(tiny_gguf, max_batch=2, exact="bitwise")
    with pytest.raises(ConfigError, match="max_batch must be"):
        _open(tiny_gguf, max_batch=0)


def test_a_closed_engine_ends_its_batched_requests(tiny_gguf: Path) -> None:
    require_llama_cpp()
    backend = _open(tiny_gguf, max_batch=2)
    stream = backend.stream(_request(PROMPTS[0], "none"))
    next(stream)
    backend.close()
    with pytest.raises(BackendError, match="closed"):
        list(stream)


def test_each_request_prices_its_draft_as_if_the_others_bring_one_row(
    batched: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the others draft this step is chosen beside it: priced from their previous
    # step, one request's draft made the others' drafts look cheap and drafts chained.
    seen: list[tuple[int, float, int, int]] = []
    original = SpeculationSession.draft

    scheduler = batched.engine.scheduler
    assert scheduler is not None

    def spy(self: SpeculationSession, *args: Any, beside: BatchShare = ALONE, **kw: Any) -> Any:
        seen.append((beside.rows, beside.tokens, beside.longest, scheduler.active))
        return original(self, *args, beside=beside, **kw)

    monkeypatch.setattr(SpeculationSession, "draft", spy)
    requests = [_request(prompt, "ngram") for prompt in PROMPTS[:2]]  # they always draft
    requests += [_request(prompt, "none") for prompt in PROMPTS[2:4]]
    cost_aware = SpecConfig(method="ngram")
    requests += [GenerationRequest(prompt=p, max_tokens=24, spec=cost_aware) for p in PROMPTS[4:]]
    assert all(text != "<failed>" for text in _concurrently(batched, requests))
    beside_others = [entry for entry in seen if entry[0]]
    assert beside_others, "no request was ever decoded beside another"
    for rows, tokens, longest, active in beside_others:
        assert tokens == rows and longest == 1 and rows < active
