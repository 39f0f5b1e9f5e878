"""llama-server's streams: tokens marked draft/target from per-chunk ``timings`` (pure).

``DraftProvenanceTracker`` reads the cumulative counters each chunk carries (see the
package docstring for the server behaviour it relies on); the two decoders stream the
OpenAI chat route and the native ``/completion`` with live statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speculative_llm.backends.engines.llamacpp.facts import LlamaServerInfo, llamacpp_stats
from speculative_llm.backends.fields import count, usage_of
from speculative_llm.backends.openai_compat.responses import map_finish_reason
from speculative_llm.backends.openai_compat.stream import OpenAIStreamDecoder, StreamDecoderBase
from speculative_llm.errors import (
    MalformedResponseError,
)
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Provenance, Token

__all__ = ["DraftProvenanceTracker", "LiveStats", "LlamaChatDecoder", "LlamaCompletionDecoder"]


class DraftProvenanceTracker:
    """Marks streamed llama-server tokens ``draft`` or ``target`` from chunk timings.

    Each chunk's ``timings`` carries the cumulative ``predicted_n`` (tokens so far) and
    ``draft_n_accepted``. A verify step that accepted m drafts emits m draft tokens and
    then one target token, and its counters grow before its first token is sent (see the
    module docstring), so growth of m marks the next m tokens as drafts.
    """

    def __init__(self) -> None:
        self.tokens_seen = 0
        self.accepted_seen = 0
        self._drafts_pending = 0
        self._last: Provenance = "target"

    def advance(
        self,
        text: str,
        predicted_n: int | None,
        accepted_total: int | None,
        token_id: int | None = None,
    ) -> tuple[Token, ...]:
        """The tokens behind one chunk's ``text`` (the text goes on the last one)."""
        if predicted_n is None:
            return (Token(text=text, provenance="unknown", id=token_id),) if text else ()
        new = predicted_n - self.tokens_seen
        if accepted_total is not None and accepted_total > self.accepted_seen:
            self._drafts_pending = accepted_total - self.accepted_seen
            self.accepted_seen = accepted_total
        if new <= 0:
            # More text for a token already counted (a second delta of one chunk).
            return (Token(text=text, provenance=self._last, id=token_id),) if text else ()
        self.tokens_seen = predicted_n
        provenances: list[Provenance] = []
        for _ in range(new):
            if self._drafts_pending > 0:
                provenances.append("draft")
                self._drafts_pending -= 1
            else:
                provenances.append("target")
        self._last = provenances[-1]
        tokens = [Token(text="", provenance=p) for p in provenances[:-1]]
        tokens.append(Token(text=text, provenance=provenances[-1], id=token_id))
        return tuple(tokens)


def _timings_of(payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    timings = payload.get("timings")
    return timings if isinstance(timings, Mapping) else None


class LiveStats:
    """Live ``SpecStats`` and provenance from per-chunk timings (both decoders)."""

    def __init__(self, info: LlamaServerInfo, tracking: bool) -> None:
        self.tracking = tracking
        self.tracker = DraftProvenanceTracker()
        # The server was asked before the request: read its answer once, not per chunk.
        self.method = info.method
        self.speculation_enabled = info.speculation_enabled

    def tokens(
        self, text: str, timings: Mapping[str, Any] | None, token_id: int | None
    ) -> tuple[Token, ...]:
        """The tokens behind a chunk's text (``unknown`` provenance without timings)."""
        if timings is None:
            return (Token(text=text, provenance="unknown", id=token_id),) if text else ()
        return self.tracker.advance(
            text,
            count(timings.get("predicted_n")),
            count(timings.get("draft_n_accepted")),
            token_id,
        )

    def stats(self, timings: Mapping[str, Any] | None) -> SpecStats | None:
        """The statistics so far, from a chunk's ``timings`` (None without them)."""
        if timings is None:
            return None
        return llamacpp_stats(
            timings, method=self.method, speculation_enabled=self.speculation_enabled
        )


class LlamaChatDecoder(OpenAIStreamDecoder):
    """OpenAI chat stream plus llama-server's per-chunk ``timings``."""

    def __init__(self, *, live: LiveStats, **options: Any) -> None:
        super().__init__(chat=True, **options)
        self._live = live
        self._held = ""
        self._timings_seen = False

    @property
    def text(self) -> str:
        """Text received so far, including text waiting for its chunk's timings."""
        return super().text + self._held

    def chunks_for(self, text: str, payload: dict[str, Any], now: float) -> list[Chunk]:
        """The chunk of a token's text once its ``timings`` arrived (held until then)."""
        if not self._live.tracking:
            return super().chunks_for(text, payload, now)
        # The usage chunk (``choices: []``) carries the request's final timings, not a token's.
        timings = _timings_of(payload) if payload.get("choices") else None
        if timings is None and not self._timings_seen:
            # The server does not (yet) send per-chunk timings: stream the text as is.
            return super().chunks_for(text, payload, now)
        self._held += text
        # llama-server puts timings on the last delta of a token's events: hold text
        # until they arrive so the tokens behind it are known.
        if timings is None:
            return []
        self._timings_seen = True
        text, self._held = self._held, ""
        tokens = self._live.tokens(text, timings, None)
        if not text and not tokens:
            return []
        self.add_text(text, now)
        return [Chunk(text=text, tokens=tokens, stats=self._live.stats(timings))]

    def finish(self, now: float) -> list[Chunk]:
        """Text still held (its timings never came), then the final chunk."""
        chunks: list[Chunk] = []
        if self._held and self.complete:
            held, self._held = self._held, ""
            self.add_text(held, now)
            chunks.append(Chunk(text=held, tokens=(Token(text=held, provenance="unknown"),)))
        return chunks + super().finish(now)


class LlamaCompletionDecoder(StreamDecoderBase):
    """Native ``/completion`` stream: ``content`` per token, last event has ``stop: true``."""

    def __init__(self, *, live: LiveStats, **options: Any) -> None:
        super().__init__(**options)
        self._live = live

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        """One ``/completion`` event: a token's ``content``, the last one ``stop: true``."""
        content = payload.get("content", "")
        if not isinstance(content, str):
            raise MalformedResponseError(
                f"'content' in a stream event from {self.url} is not a string.", url=self.url
            )
        ids = payload.get("tokens")
        token_id = ids[-1] if isinstance(ids, list) and ids and isinstance(ids[-1], int) else None
        timings = _timings_of(payload)
        if payload.get("stop") is True:
            self.mark_done()
            self.finish_reason = map_finish_reason(payload.get("stop_type"))
            self.extras.update(payload)
            usage = usage_of(payload.get("tokens_evaluated"), payload.get("tokens_predicted"))
            self.usage = usage or self.usage
        tokens = (
            self._live.tokens(content, timings, token_id)
            if self._live.tracking
            else ((Token(text=content, provenance="unknown", id=token_id),) if content else ())
        )
        if not content and not tokens:
            return []
        self.add_text(content, now)
        stats = self._live.stats(timings) if self._live.tracking and not self.done else None
        return [Chunk(text=content, tokens=tokens, stats=stats)]
