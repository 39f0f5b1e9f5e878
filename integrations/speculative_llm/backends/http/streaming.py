"""A streamed body, as bytes arrive: SSE events, then chunks from an engine's decoder (pure).

``StreamSession`` feeds the bytes to the SSE parser and each event to the backend's
``StreamDecoder``; it keeps the text received so far, so an error can carry it, and it
holds the stream to its ``StreamLimits``: a deadline for the whole stream, a longest
silence between data events (keep-alive comments such as llama-server's ``: ping`` are
not progress), and ``max_tokens`` (a server that sends more is cut off there).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from speculative_llm.backends.http.sse import SSEEvent, SSEParser
from speculative_llm.errors import (
    BackendError,
    BackendTimeoutError,
    GenerationCancelledError,
    MalformedResponseError,
)
from speculative_llm.types import Chunk

__all__ = ["StreamDecoder", "StreamLimits", "StreamSession"]

logger = logging.getLogger("speculative_llm.backends.http")


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What a stream may take.

    Attributes:
        total_s: Seconds the whole stream may last, from the request (None: no limit).
        idle_s: Longest wait for the next data event; keep-alive comments do not count
            (None: no limit).
        max_tokens: Tokens asked for; a server that sends more is cut off there and the
            stream ends with finish reason ``length`` (None: no limit).
    """

    total_s: float | None = None
    idle_s: float | None = None
    max_tokens: int | None = None


class StreamDecoder(Protocol):
    """Turns the events of one streamed response into chunks (no I/O)."""

    @property
    def done(self) -> bool:
        """Whether the stream's end marker was seen."""

    @property
    def text(self) -> str:
        """All text received so far."""

    def feed(self, event: SSEEvent, now: float) -> list[Chunk]:
        """Decode one event."""

    def finish(self, now: float) -> list[Chunk]:
        """End of the stream: the final chunk, or ``StreamInterruptedError`` if incomplete."""

    def final_chunk(self, now: float) -> Chunk:
        """The closing chunk (finish reason, usage, statistics) of what was received."""


class StreamSession:
    """Bytes of a streamed body -> SSE events -> chunks, keeping the text for errors.

    ``decode`` (or ``adecode``) turns the body's pieces into chunks until the decoder
    sees the end marker; ``end`` then yields the final chunk. Inside
    ``keeping_partial_text``, an error raised meanwhile carries the text received so far.
    """

    def __init__(
        self,
        decoder: StreamDecoder,
        *,
        url: str,
        clock: Callable[[], float],
        limits: StreamLimits | None = None,
        engine: str = "the server",
    ) -> None:
        self._decoder = decoder
        self._parser = SSEParser()
        self._url = url
        self._clock = clock
        self._limits = limits or StreamLimits()
        self._engine = engine
        self._started = clock()
        self._last_event = self._started
        self._tokens = 0
        self.overran = False
        """Whether the server sent more than ``max_tokens`` tokens (the stream was cut)."""

    @property
    def done(self) -> bool:
        """Whether the decoder saw the end of the stream, or the stream was cut at its limit."""
        return self._decoder.done or self.overran

    def feed(self, raw: bytes) -> list[Chunk]:
        """Decode the next piece of the body."""
        try:
            events = self._parser.feed(raw)
        except ValueError as error:
            raise MalformedResponseError(
                f"Bad event stream from {self._url}: {error}", url=self._url
            ) from None
        if events:
            self._last_event = self._clock()
        chunks = self._decode_events(events)
        self._check_time()
        return chunks

    def _check_time(self) -> None:
        """Raise ``BackendTimeoutError`` when the stream ran past a time limit."""
        if self.done:
            return
        now = self._clock()
        total, idle = self._limits.total_s, self._limits.idle_s
        if total is not None and now - self._started > total:
            raise BackendTimeoutError(
                f"The stream from {self._engine} at {self._url} ran past stream_timeout="
                f"{total:g} s, the limit of a whole streamed call; the text received so far is "
                "in partial_text. Pass a larger stream_timeout=... (backend_options) for "
                "longer generations, or a smaller max_tokens.",
                url=self._url,
            )
        if idle is not None and now - self._last_event > idle:
            raise BackendTimeoutError(
                f"The stream from {self._engine} at {self._url} sent no data for {idle:g} s "
                "(timeout=...; keep-alive pings do not count); the text received so far is "
                "in partial_text. The server may be stuck or overloaded (see its log); if it "
                "is just slow, pass a larger timeout=....",
                url=self._url,
            )

    def decode(self, pieces: Iterable[bytes]) -> Iterator[Chunk]:
        """The chunks of the body's pieces, up to the stream's end marker."""
        for piece in pieces:
            yield from self.feed(piece)
            if self.done:
                return

    async def adecode(self, pieces: AsyncIterable[bytes]) -> AsyncIterator[Chunk]:
        """Async twin of ``decode``."""
        async for piece in pieces:
            for chunk in self.feed(piece):
                yield chunk
            if self.done:
                return

    def end(self) -> list[Chunk]:
        """The body ended: flush the parser and let the decoder produce the final chunk."""
        if self.overran:
            return [self._cut_final_chunk()]
        chunks = self._decode_events(self._parser.close())
        chunks.extend(self._decoder.finish(self._clock()))
        return chunks

    def _decode_events(self, events: Iterable[SSEEvent]) -> list[Chunk]:
        chunks: list[Chunk] = []
        for event in events:
            if self.done:
                break
            for chunk in self._decoder.feed(event, self._clock()):
                if not self._within_max_tokens(chunk):
                    self.overran = True
                    break
                chunks.append(chunk)
        return chunks

    def _within_max_tokens(self, chunk: Chunk) -> bool:
        """Count the chunk's tokens; False once the server sends more than ``max_tokens``."""
        limit = self._limits.max_tokens
        if limit is None or not (chunk.text or chunk.tokens):
            return True
        if self._tokens >= limit:
            return False
        # An event carries at least one token (several when the engine batches them).
        self._tokens += max(1, len(chunk.tokens))
        return True

    def _cut_final_chunk(self) -> Chunk:
        """The closing chunk of a stream cut at ``max_tokens`` (finish reason ``length``)."""
        message = (
            f"{self._engine} at {self._url} kept streaming past max_tokens="
            f"{self._limits.max_tokens}; the client stopped reading there"
        )
        logger.warning("%s.", message)
        closing = self._decoder.final_chunk(self._clock())
        stats = closing.stats
        if stats is not None:
            note = f"{stats.note}; {message}" if stats.note else message
            stats = dataclasses.replace(stats, note=note)
        return dataclasses.replace(closing, finish_reason="length", stats=stats, final=True)

    @contextmanager
    def keeping_partial_text(self) -> Iterator[None]:
        """Give an error raised inside the text received so far (if it has none).

        Applies to ``BackendError`` and ``GenerationCancelledError`` (a cancelled stream).
        """
        try:
            yield
        except (BackendError, GenerationCancelledError) as error:
            if not error.partial_text:
                error.partial_text = self._decoder.text
            raise error from None
