"""A streamed body, as bytes arrive: SSE events, then chunks from an engine's decoder (pure).

``StreamSession`` feeds the bytes to the SSE parser and each event to the backend's
``StreamDecoder``; it keeps the text received so far, so an error can carry it.
"""

from __future__ import annotations

from collections.abc import Callable
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
    """Bytes of a streamed body -> SSE events -> chunks, keeping the text for errors."""

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
        chunks: list[Chunk] = []
        for event in events:
            if self._decoder.done:
                break
            chunks.extend(self._decoder.feed(event, self._clock()))
        return chunks

    def end(self) -> list[Chunk]:
        """The body ended: flush the parser and let the decoder produce the final chunk."""
        chunks: list[Chunk] = []
        for event in self._parser.close():
            if self._decoder.done:
                break
            chunks.extend(self._decoder.feed(event, self._clock()))
        chunks.extend(self._decoder.finish(self._clock()))
        return chunks

    def attach_partial_text(self, error: BackendError) -> BackendError:
        """Give an error the text received so far (when it has none yet)."""
        if not error.partial_text:
            error.partial_text = self._decoder.text
        return error
