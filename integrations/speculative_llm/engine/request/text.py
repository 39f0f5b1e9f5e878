"""Streaming text assembly: incremental detokenization and stop strings.

Token ids become ``Token`` objects with their text delta; text that could be the start
of a stop string is held back until it is known not to be, and a stop string ends the
output (it is not included). Kept apart from the engine so it can be tested with any
tokenizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.types import Provenance, Token

__all__ = [
    "IncrementalDetokenizer",
    "OutputText",
    "PendingToken",
    "StopStringFilter",
    "make_pending",
]

_CONTEXT_TOKENS = 5
"""Prompt tokens decoded along with the first generated ones, so tokenizers that drop
a leading space at the start of a decode (SentencePiece) get it right."""


class IncrementalDetokenizer:
    r"""Turns token ids into text deltas whose concatenation is the decoded text.

    Uses the prefix/read-offset method of TGI and vLLM: each new token is decoded
    together with a few previous ones, and the delta is released once it does not end
    in an incomplete UTF-8 sequence (``\\ufffd``).

    Args:
        tokenizer: The model's tokenizer (``models.tokenizers.Tokenizer``).
        prompt_tokens: The prompt, whose last tokens give the first delta its context.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_tokens: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(prompt_tokens[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character, decoded as is)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""


@dataclass(slots=True)
class PendingToken:
    """A generated token waiting to be released.

    Attributes:
        token: The token (id, text, provenance).
        draft_position: Its position in the draft when it is an accepted draft token.
    """

    token: Token
    draft_position: int | None


class StopStringFilter:
    """Holds back possible stop-string prefixes and cuts the output at a stop string.

    Tokens are released whole, so every released chunk's text equals the text of its
    tokens; the token in which a stop string begins is released with its text cut
    before the stop string, and the tokens after it are dropped.

    Args:
        stop: Stop strings (may be empty).
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = tuple(stop)
        self._pending: list[PendingToken] = []
        self.stopped = False

    def _held_suffix_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that begins some stop string."""
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def add(self, tokens: Sequence[PendingToken]) -> tuple[list[PendingToken], list[PendingToken]]:
        """Add a step's tokens.

        Returns:
            ``(released, dropped)``: tokens safe to emit now, and tokens discarded
            because they follow a stop string (then ``stopped`` is True).
        """
        if self.stopped:
            return [], list(tokens)
        self._pending.extend(tokens)
        if not self._stop:
            everything, self._pending = self._pending, []
            return everything, []
        text = "".join(item.token.text for item in self._pending)
        found = [index for stop in self._stop if (index := text.find(stop)) >= 0]
        if found:
            return self._cut(min(found))
        safe = len(text) - self._held_suffix_length(text)
        released: list[PendingToken] = []
        offset = 0
        for item in self._pending:
            end = offset + len(item.token.text)
            if end > safe:
                break
            released.append(item)
            offset = end
        del self._pending[: len(released)]
        return released, []

    def _cut(self, stop_index: int) -> tuple[list[PendingToken], list[PendingToken]]:
        released: list[PendingToken] = []
        dropped: list[PendingToken] = []
        offset = 0
        for item in self._pending:
            text = item.token.text
            if offset < stop_index:
                keep = text[: stop_index - offset]
                if keep != text:
                    item = PendingToken(
                        Token(keep, item.token.provenance, item.token.id), item.draft_position
                    )
                released.append(item)
            else:
                dropped.append(item)
            offset += len(text)
        self._pending = []
        self.stopped = True
        return released, dropped

    def flush(self) -> list[PendingToken]:
        """Release everything held back (the generation ended without a stop string)."""
        released, self._pending = self._pending, []
        return released


def make_pending(
    token_ids: Sequence[int], num_accepted: int, detokenizer: IncrementalDetokenizer
) -> list[PendingToken]:
    """Wrap one step's token ids: the first ``num_accepted`` are accepted draft tokens."""
    pending: list[PendingToken] = []
    for position, token_id in enumerate(token_ids):
        provenance: Provenance = "draft" if position < num_accepted else "target"
        pending.append(
            PendingToken(
                Token(detokenizer.push(token_id), provenance, token_id),
                position if position < num_accepted else None,
            )
        )
    return pending


class OutputText:
    """The text of one generation, step by step: its tokens, cut at a stop string.

    Joins an ``IncrementalDetokenizer`` and a ``StopStringFilter``: each step's ids
    become tokens (its accepted draft tokens marked ``draft``), text that may begin a
    stop string waits, and the step that ends the generation releases what still waits,
    with the text an incomplete character held back added to the last token (so that a
    chunk's text is always the text of its tokens).

    Args:
        tokenizer: The model's tokenizer.
        prompt_tokens: The prompt (its last tokens give the first delta its context).
        stop: Stop strings (may be empty).
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_tokens: Sequence[int], stop: Sequence[str]
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_tokens)
        self._stop_filter = StopStringFilter(stop)

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the text."""
        return self._stop_filter.stopped

    def add(
        self, token_ids: Sequence[int], num_accepted: int, *, last: bool
    ) -> tuple[tuple[Token, ...], int]:
        """Add one step: its first ``num_accepted`` ids are accepted draft tokens.

        Args:
            token_ids: The step's token ids.
            num_accepted: How many of them are accepted draft tokens.
            last: Whether the engine ends the generation with this step: then
                everything held back is released (unless a stop string ended it).

        Returns:
            ``(tokens, dropped)``: the tokens to emit now, and how many of the step's
            tokens were dropped because they follow a stop string.
        """
        pending = make_pending(token_ids, num_accepted, self._detokenizer)
        released, dropped = self._stop_filter.add(pending)
        if last and not self.stopped:
            tail = self._detokenizer.flush()
            released += self._stop_filter.flush()
            if tail and released:
                final = released[-1]
                final.token = dataclasses.replace(final.token, text=final.token.text + tail)
        return tuple(item.token for item in released), len(dropped)
