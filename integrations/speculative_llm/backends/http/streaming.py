"""A streamed body, as bytes arrive: SSE events, then chunks from an engine's decoder (pure).

``StreamSession`` feeds the bytes to the SSE parser and each event to the backend's
``StreamDecoder``; it keeps the text received so far, so an error can carry it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

from speculative_llm.backends.http.sse import SSEEvent, SSEParser
from speculative_llm.errors import BackendError, MalformedResponseError
from speculative_llm.types import Chunk

__all__ = ["StreamDecoder", "StreamSession"]


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


class StreamSession:
    """Bytes of a streamed body -> SSE events -> chunks, keeping the text for errors.

    ``decode`` (or ``adecode``) turns the body's pieces into chunks until the decoder
    sees the end marker; ``end`` then yields the final chunk. Inside
    ``keeping_partial_text``, an error raised meanwhile carries the text received so far.
    """

    def __init__(self, decoder: StreamDecoder, *, url: str, clock: Callable[[], float]) -> None:
        self._decoder = decoder
        self._parser = SSEParser()
        self._url = url
        self._clock = clock

    @property
    def done(self) -> bool:
        """Whether the decoder saw the end of the stream."""
        return self._decoder.done

    def feed(self, raw: bytes) -> list[Chunk]:
        """Decode the next piece of the body."""
        try:
            events = self._parser.feed(raw)
        except ValueError as error:
            raise MalformedResponseError(
                f"Bad event stream from {self._url}: {error}", url=self._url
            ) from None
        return self._decode_events(events)

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
        chunks = self._decode_events(self._parser.close())
        chunks.extend(self._decoder.finish(self._clock()))
        return chunks

    def _decode_events(self, events: Iterable[SSEEvent]) -> list[Chunk]:
        chunks: list[Chunk] = []
        for event in events:
            if self._decoder.done:
                break
            chunks.extend(self._decoder.feed(event, self._clock()))
        return chunks

    @contextmanager
    def keeping_partial_text(self) -> Iterator[None]:
        """Give a ``BackendError`` raised inside the text received so far (if it has none)."""
        try:
            yield
        except BackendError as error:
            if not error.partial_text:
                error.partial_text = self._decoder.text
            raise error from None
