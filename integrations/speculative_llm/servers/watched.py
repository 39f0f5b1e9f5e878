"""The backend of a managed llama-server: a server that died is named, with its signal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.errors import BackendError
from speculative_llm.servers.process import ManagedServer
from speculative_llm.types import Chunk, Completion, GenerationRequest

__all__ = ["WatchedLlamaCppBackend"]


class WatchedLlamaCppBackend(LlamaCppBackend):
    """A ``LlamaCppBackend`` of a server this process started and watches.

    A request that fails because the server died (a crash in its kernels, say) raises
    ``EngineCrashedError`` naming the signal and what to try, with the partial text,
    instead of a connection error.

    Args:
        base_url: The server's URL.
        server: The managed server behind it.
        **options: ``LlamaCppBackend`` options.
    """

    def __init__(self, base_url: str, *, server: ManagedServer, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._server = server

    def _explained(self, error: BackendError) -> BackendError:
        crash = self._server.crash_error(partial_text=error.partial_text)
        return error if crash is None else crash

    def generate(self, request: GenerationRequest) -> Completion:
        """See ``LlamaCppBackend.generate``; a dead server raises ``EngineCrashedError``."""
        try:
            return super().generate(request)
        except BackendError as error:
            raise self._explained(error) from error

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """See ``LlamaCppBackend.agenerate``; a dead server raises ``EngineCrashedError``."""
        try:
            return await super().agenerate(request)
        except BackendError as error:
            raise self._explained(error) from error

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """See ``LlamaCppBackend.stream``; a dead server raises ``EngineCrashedError``."""
        chunks = super().stream(request)

        def watched() -> Iterator[Chunk]:
            try:
                yield from chunks
            except BackendError as error:
                raise self._explained(error) from error

        return watched()

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """See ``LlamaCppBackend.astream``; a dead server raises ``EngineCrashedError``."""
        chunks = super().astream(request)

        async def watched() -> AsyncIterator[Chunk]:
            try:
                async for chunk in chunks:
                    yield chunk
            except BackendError as error:
                raise self._explained(error) from error
            finally:
                close = getattr(chunks, "aclose", None)
                if close is not None:  # a consumer that stopped early frees the stream now
                    await close()

        return watched()
