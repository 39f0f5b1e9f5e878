"""Property tests: random, truncated and mutated bodies never crash or hang a parser.

Every backend's stream decoder and answer parser, the SSE parser, the Prometheus parser
and the error helpers get arbitrary input. The outcome must be a valid result or one of
our typed errors (``SpeculativeError`` subclasses), never a ``KeyError``/``TypeError``/...
and never a hang (hypothesis' deadline plus a pytest timeout).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakeserver import fixture_bytes
from speculative_llm import Chunk, GenerationRequest, Message, SpeculativeError
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.http import extract_server_message, parse_retry_after
from speculative_llm.backends.http.sse import SSEParser
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.backends.prometheus import parse_prometheus_text

pytestmark = pytest.mark.timeout(300)

URL = "http://127.0.0.1:9"
CHAT = GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=16)
PROMPT = GenerationRequest(prompt="Hello", max_tokens=16)

BACKENDS = [
    OpenAICompatibleBackend(URL),
    LlamaCppBackend(URL),
    LlamaCppBackend(URL, live_stats=False),
    VLLMBackend(URL),
    SGLangBackend(URL),
    SGLangBackend(URL, native_stream_text="incremental"),
    LMStudioBackend(URL, draft_model="d"),
    TGIBackend(URL),
]
REQUESTS = [CHAT, PROMPT]

STREAM_FIXTURES = [
    "openai/chat_stream.sse",
    "openai/chat_stream_prediction.sse",
    "openai/chat_tool_calls_stream.sse",
    "vllm/chat_stream_spec.sse",
    "sglang/generate_stream.sse",
    "sglang/chat_stream_spec.sse",
    "lmstudio/chat_stream_speculative.sse",
    "tgi/generate_stream.sse",
    "tgi/chat_stream.sse",
    "llamacpp/chat_stream_spec_timings.sse",
    "llamacpp/completion_stream_spec_timings.sse",
    "llamacpp/chat_stream_spec.sse",
]
ANSWER_FIXTURES = [
    "openai/chat_completion.json",
    "openai/chat_tool_calls.json",
    "openai/chat_prediction.json",
    "openai/completion.json",
    "vllm/chat_spec_detailed.json",
    "vllm/chat_spec_summary.json",
    "vllm/chat_timing_metrics.json",
    "sglang/generate.json",
    "sglang/generate_canonical.json",
    "sglang/generate_legacy.json",
    "sglang/chat_spec_details.json",
    "lmstudio/chat_speculative.json",
    "tgi/generate.json",
    "llamacpp/chat_spec.json",
    "llamacpp/completion_spec.json",
]

# Field names the parsers look for, so random payloads reach deep code paths.
KEYS = [
    "choices",
    "delta",
    "message",
    "content",
    "text",
    "index",
    "finish_reason",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "id",
    "model",
    "error",
    "code",
    "timings",
    "predicted_n",
    "predicted_ms",
    "prompt_ms",
    "draft_n",
    "draft_n_accepted",
    "stop",
    "stop_type",
    "tokens",
    "tokens_predicted",
    "tokens_evaluated",
    "metrics",
    "speculative_decoding",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
    "num_spec_steps",
    "num_spec_tokens",
    "per_step_accepted",
    "per_step_drafted",
    "acceptance_histogram",
    "generation_time_ms",
    "time_to_first_token_ms",
    "meta_info",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_accept_token_num",
    "spec_correct_drafts_histogram",
    "sglext",
    "spec_tokens_details",
    "stats",
    "total_draft_tokens_count",
    "accepted_draft_tokens_count",
    "generation_time",
    "time_to_first_token",
    "token",
    "special",
    "generated_text",
    "details",
    "generated_tokens",
    "input_length",
    "type",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS), children, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5)

fast = settings(
    max_examples=40,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def consume_stream(
    backend: OpenAICompatibleBackend, request: GenerationRequest, body: bytes, split: int
) -> list[Chunk] | SpeculativeError:
    pieces = [body[i : i + split] for i in range(0, len(body), split)] or [b""]
    try:
        chunks = list(backend.replay_stream(request, pieces))
    except SpeculativeError as error:
        return error
    assert chunks and chunks[-1].final
    assert all(isinstance(c, Chunk) for c in chunks)
    assert sum(c.final for c in chunks) == 1
    return chunks


def parse_answer(
    backend: OpenAICompatibleBackend, request: GenerationRequest, body: bytes | dict[str, Any]
) -> object:
    try:
        completion = backend.parse_response(request, body)
    except SpeculativeError as error:
        return error
    assert isinstance(completion.text, str)
    assert completion.stats.backend
    return completion


def sse(payloads_: list[Any], done: bool) -> bytes:
    body = "".join(f"data: {json.dumps(p)}\n\n" for p in payloads_)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


@fast
@given(data=st.binary(max_size=400), split=st.integers(min_value=1, max_value=64))
def test_sse_parser_accepts_any_bytes(data: bytes, split: int) -> None:
    parser = SSEParser()
    events = []
    for start in range(0, len(data), split):
        events.extend(parser.feed(data[start : start + split]))
    events.extend(parser.close())
    assert all(isinstance(e.data, str) for e in events)


@fast
@given(
    backend=st.sampled_from(BACKENDS),
    request=st.sampled_from(REQUESTS),
    data=st.binary(max_size=300),
    split=st.integers(min_value=1, max_value=50),
)
def test_stream_decoders_survive_random_bytes(
    backend: OpenAICompatibleBackend, request: GenerationRequest, data: bytes, split: int
) -> None:
    consume_stream(backend, request, data, split)


@fast
@given(
    backend=st.sampled_from(BACKENDS),
    request=st.sampled_from(REQUESTS),
    events=st.lists(payloads, max_size=4),
    done=st.booleans(),
    split=st.integers(min_value=1, max_value=80),
)
def test_stream_decoders_survive_random_json_events(
    backend: OpenAICompatibleBackend,
    request: GenerationRequest,
    events: list[dict[str, Any]],
    done: bool,
    split: int,
) -> None:
    consume_stream(backend, request, sse(events, done), split)


@fast
@given(
    backend=st.sampled_from(BACKENDS),
    request=st.sampled_from(REQUESTS),
    relative=st.sampled_from(STREAM_FIXTURES),
    cut=st.floats(min_value=0.0, max_value=1.0),
    split=st.integers(min_value=1, max_value=90),
)
def test_truncated_real_streams_give_a_result_or_a_typed_error(
    backend: OpenAICompatibleBackend,
    request: GenerationRequest,
    relative: str,
    cut: float,
    split: int,
) -> None:
    body = fixture_bytes(relative)
    outcome = consume_stream(backend, request, body[: int(len(body) * cut)], split)
    if isinstance(outcome, SpeculativeError):
        # Whatever arrived before the cut is kept for the caller.
        assert isinstance(getattr(outcome, "partial_text", ""), str)


@fast
@given(
    backend=st.sampled_from(BACKENDS),
    relative=st.sampled_from(STREAM_FIXTURES),
    position=st.floats(min_value=0.0, max_value=1.0),
    junk=st.binary(min_size=1, max_size=8),
)
def test_corrupted_real_streams_give_a_result_or_a_typed_error(
    backend: OpenAICompatibleBackend, relative: str, position: float, junk: bytes
) -> None:
    body = fixture_bytes(relative)
    at = int(len(body) * position)
    corrupted = body[:at] + junk + body[at + len(junk) :]
    for request in REQUESTS:
        consume_stream(backend, request, corrupted, 31)


@fast
@given(
    backend=st.sampled_from(BACKENDS),
    request=st.sampled_from(REQUESTS),
    payload=payloads,
)
def test_answer_parsers_survive_random_json(
    backend: OpenAICompatibleBackend, request: GenerationRequest, payload: dict[str, Any]
) -> None:
    parse_answer(backend, request, payload)


@fast
@given(
    backend=st.sampled_from(BACKENDS),
    request=st.sampled_from(REQUESTS),
    relative=st.sampled_from(ANSWER_FIXTURES),
    cut=st.floats(min_value=0.0, max_value=1.0),
)
def test_truncated_real_answers_give_a_result_or_a_typed_error(
    backend: OpenAICompatibleBackend, request: GenerationRequest, relative: str, cut: float
) -> None:
    body = fixture_bytes(relative)
    parse_answer(backend, request, body[: int(len(body) * cut)])


@fast
@given(text=st.text(max_size=300))
def test_prometheus_parser_accepts_any_text(text: str) -> None:
    snapshot = parse_prometheus_text(text)
    for rows in snapshot.samples.values():
        assert all(isinstance(r.value, float) for r in rows)


@fast
@given(value=st.text(max_size=40), body=st.binary(max_size=200))
def test_header_and_error_helpers_accept_anything(value: str, body: bytes) -> None:
    delay = parse_retry_after(value)
    assert delay is None or delay >= 0
    message = extract_server_message(body)
    assert message is None or len(message) <= 500
