"""Streamed OpenAI answers: SSE events in, ``Chunk`` objects out (pure, no I/O).

``StreamDecoderBase`` keeps what every engine's decoder needs (text so far, first-token
time, finish reason, usage, error events); ``OpenAIStreamDecoder`` decodes
``chat.completion.chunk`` and ``text_completion`` events, tool-call deltas included.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from speculative_llm.backends.http import EngineHints, decode_json_object, error_for_status
from speculative_llm.backends.http.sse import SSEEvent
from speculative_llm.backends.openai_compat.responses import (
    PredictionCounts,
    ResponseSummary,
    extension_fields,
    map_finish_reason,
    parse_prediction_counts,
    parse_tool_arguments,
    parse_usage,
    raise_error_payload,
)
from speculative_llm.errors import MalformedResponseError, StreamInterruptedError
from speculative_llm.stats import SpecStats
from speculative_llm.types import (
    Chunk,
    FinishReason,
    ToolCall,
    ToolCallDelta,
    ToolCallJoiner,
    Usage,
)

__all__ = ["DecoderOptions", "OpenAIStreamDecoder", "StreamDecoderBase"]


class DecoderOptions(TypedDict):
    """What every stream decoder takes (``StreamDecoderBase``'s keyword arguments)."""

    url: str
    hints: EngineHints
    started: float
    stats: Callable[[ResponseSummary], SpecStats]


class StreamDecoderBase:
    """Bookkeeping shared by the stream decoders of every engine.

    Subclasses implement ``feed_payload`` (one JSON event); the final chunk carries the
    ``SpecStats`` that ``stats`` builds from the decoder's ``summary``.

    Args:
        url: The URL streamed from (for errors).
        hints: Engine wording for errors.
        started: ``time.perf_counter()`` when the request was sent.
        stats: Builds the final ``SpecStats`` (the backend's ``build_stats``).
    """

    def __init__(
        self,
        *,
        url: str,
        hints: EngineHints,
        started: float,
        stats: Callable[[ResponseSummary], SpecStats],
    ) -> None:
        self.url = url
        self.hints = hints
        self.started = started
        self.first_token_at: float | None = None
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        self.prediction: PredictionCounts | None = None
        self.extras: dict[str, Any] = {}
        self._pieces: list[str] = []
        self._done = False
        self._stats = stats

    @property
    def done(self) -> bool:
        """Whether the stream's end marker was seen."""
        return self._done

    @property
    def text(self) -> str:
        """All text received so far."""
        return "".join(self._pieces)

    def add_text(self, text: str, now: float) -> None:
        """Record streamed text (and the time of the first text)."""
        if text:
            if self.first_token_at is None:
                self.first_token_at = now
            self._pieces.append(text)

    def mark_done(self) -> None:
        """Record that the end of the stream was reached."""
        self._done = True

    def feed(self, event: SSEEvent, now: float) -> list[Chunk]:
        """Decode one event (shared checks, then ``feed_payload``)."""
        if event.is_done:
            self._done = True
            return []
        payload = decode_json_object(event.data, url=self.url, what="stream event")
        if payload.get("error") is not None:
            raise_error_payload(payload, self.url, self.hints, partial_text=self.text)
        if event.event == "error":
            raise error_for_status(
                500, event.data, url=self.url, hints=self.hints, partial_text=self.text
            )
        return self.feed_payload(payload, now)

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        """Decode one JSON event."""
        raise NotImplementedError

    @property
    def complete(self) -> bool:
        """Whether the stream carried everything (an end marker or a finish reason)."""
        return self._done or self.finish_reason is not None

    def finish(self, now: float) -> list[Chunk]:
        """The final chunk, or ``StreamInterruptedError`` if the stream stopped early."""
        if not self.complete:
            raise StreamInterruptedError(
                f"The stream from {self.hints.engine} at {self.url} ended before its end marker "
                f"({len(self.text)} characters received, kept in partial_text). Did the server "
                "crash, restart or hit a proxy timeout?",
                url=self.url,
                partial_text=self.text,
            )
        return [self.final_chunk(now)]

    def final_chunk(self, now: float) -> Chunk:
        """The chunk that closes the stream: finish reason, usage, final statistics."""
        return Chunk(
            stats=self._stats(self.summary(now)),
            finish_reason=self.finish_reason,
            usage=self.usage,
            final=True,
        )

    def summary(self, now: float, headers: Mapping[str, str] | None = None) -> ResponseSummary:
        """What the statistics hooks need."""
        return ResponseSummary(
            text=self.text,
            usage=self.usage,
            extras=dict(self.extras),
            finish_reason=self.finish_reason,
            started=self.started,
            first_token_at=self.first_token_at,
            ended=now,
            streamed=True,
            headers=headers or {},
            prediction=self.prediction,
        )


class _ToolCallAccumulator:
    """Reads streamed ``delta.tool_calls`` into ``ToolCallDelta``s and joins the calls.

    A call's pieces share its ``index`` (a piece without one is placed by its position in
    the list). The call keeps the first id it is given; a call whose first piece has no
    id gets one made up (``call_...``), since agents match tool results to calls by id.
    """

    def __init__(self) -> None:
        self._joiner = ToolCallJoiner()

    def feed(self, deltas: object, url: str) -> tuple[ToolCallDelta, ...]:
        """The pieces of one event's ``delta.tool_calls``, recorded for ``result``.

        Raises:
            MalformedResponseError: The list, a piece, or one of its fields has the wrong
                shape (the message names which).
        """
        if not isinstance(deltas, list):
            raise MalformedResponseError(
                f"delta.tool_calls from {url} is not a list ({type(deltas).__name__}).", url=url
            )
        return tuple(self._piece(position, delta, url) for position, delta in enumerate(deltas))

    def _piece(self, position: int, delta: object, url: str) -> ToolCallDelta:
        where = f"delta.tool_calls[{position}] from {url}"
        if not isinstance(delta, dict):
            raise MalformedResponseError(f"{where} is not an object.", url=url)
        index = delta.get("index", position)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise MalformedResponseError(
                f"{where} has index {index!r}; expected a non-negative integer.", url=url
            )
        call_id = _optional_string(delta.get("id"), f"{where} has an id", url)
        function = delta.get("function")
        if function is None:
            function = {}
        if not isinstance(function, dict):
            raise MalformedResponseError(
                f"{where} has a function of type {type(function).__name__}; expected an object.",
                url=url,
            )
        name = _optional_string(function.get("name"), f"{where} has a function name", url)
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # a whole object, not JSON text
            arguments = json.dumps(arguments)
        arguments = _optional_string(arguments, f"{where} has arguments", url)
        known = self._joiner.get(index)
        if known is None:
            call_id = call_id or f"call_{uuid.uuid4().hex[:24]}"
        elif call_id is not None and call_id != known.id:
            call_id = None  # the call already has its id: keep the one given first
        piece = ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments)
        self._joiner.add(piece)
        return piece

    def result(self, url: str) -> tuple[ToolCall, ...]:
        """The complete calls, in index order.

        Raises:
            MalformedResponseError: A call never named its function, or its arguments are
                not a JSON object.
        """
        calls = []
        for joined in self._joiner.calls():
            if not joined.name:
                raise MalformedResponseError(
                    f"The streamed tool call {joined.index} from {url} never named its function.",
                    url=url,
                )
            calls.append(
                ToolCall(
                    name=joined.name,
                    arguments=parse_tool_arguments(joined.arguments, joined.name, url),
                    id=joined.id,
                )
            )
        return tuple(calls)


def _optional_string(value: object, what: str, url: str) -> str | None:
    """``value`` when a string, None when absent or empty; else the error naming ``what``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedResponseError(
            f"{what} of type {type(value).__name__} ({value!r:.80}); expected a string.", url=url
        )
    return value


class OpenAIStreamDecoder(StreamDecoderBase):
    """Decodes ``chat.completion.chunk`` / ``text_completion`` streams.

    Args:
        chat: Chat deltas (``delta.content``) rather than completion ``text``.
        **options: ``StreamDecoderBase``'s (url, hints, started, stats).
    """

    def __init__(self, *, chat: bool, **options: Any) -> None:
        super().__init__(**options)
        self.chat = chat
        self.model = ""
        self._tool_calls = _ToolCallAccumulator()

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        """Decode one chunk object."""
        model = payload.get("model")
        if isinstance(model, str) and model:
            self.model = model
        self.extras.update(extension_fields(payload))
        usage = parse_usage(payload.get("usage"))
        if usage is not None:
            self.usage = usage
            self.prediction = parse_prediction_counts(payload.get("usage"))
        choices = payload.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise MalformedResponseError(f"choices from {self.url} is not a list.", url=self.url)
        text = ""
        tool_call_deltas: list[ToolCallDelta] = []
        for choice in choices or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            text += self._choice_text(choice, tool_call_deltas)
            reason = map_finish_reason(choice.get("finish_reason"))
            if reason is not None:
                self.finish_reason = reason
        chunks = self.chunks_for(text, payload, now)
        if tool_call_deltas:
            # The calls' pieces go on as they come, after the event's text (if any).
            chunks.append(Chunk(tool_call_deltas=tuple(tool_call_deltas)))
        return chunks

    def _choice_text(self, choice: dict[str, Any], tool_call_deltas: list[ToolCallDelta]) -> str:
        """The text of one choice; its tool-call pieces are added to ``tool_call_deltas``."""
        if not self.chat:
            text = choice.get("text")
            if text is not None and not isinstance(text, str):
                raise MalformedResponseError(
                    f"choices[0].text from {self.url} is not a string.", url=self.url
                )
            return text or ""
        delta = choice.get("delta")
        if delta is None:
            return ""
        if not isinstance(delta, dict):
            raise MalformedResponseError(f"A delta from {self.url} is not an object.", url=self.url)
        if delta.get("tool_calls") is not None:
            tool_call_deltas.extend(self._tool_calls.feed(delta["tool_calls"], self.url))
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedResponseError(
                f"delta.content from {self.url} is not a string.", url=self.url
            )
        return content or ""

    def chunks_for(self, text: str, payload: dict[str, Any], now: float) -> list[Chunk]:
        """The chunks of one event's text (engines with token-level data override this)."""
        if not text:
            return []
        self.add_text(text, now)
        return [Chunk(text=text)]

    def final_chunk(self, now: float) -> Chunk:
        """The closing chunk: finish reason, usage, the final statistics and the tool calls.

        The calls came in pieces (``tool_call_deltas``) on earlier chunks; this one holds
        them complete and parsed.
        """
        tool_calls = self._tool_calls.result(self.url)
        reason = self.finish_reason
        if tool_calls and reason in (None, "stop"):
            reason = "tool_calls"
        closing = super().final_chunk(now)
        return dataclasses.replace(closing, finish_reason=reason, tool_calls=tool_calls)
