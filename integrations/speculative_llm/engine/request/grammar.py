"""Grammar-constrained speculative decoding: xgrammar matchers inside the exact loop.

A ``Constraint`` follows one generation through a grammar (a JSON schema, a tool call,
standard JSON, a regular expression or an EBNF grammar), compiled by xgrammar for the
target's vocabulary. In each step of the loop:

1. ``cut(draft)`` advances the matcher through the proposed tokens, filling the token
   bitmask of every position on the way, and stops at the first token the grammar
   forbids: that token and the rest of the proposal are dropped before verification
   (they could never be accepted, so they cost no verify row);
2. ``mask(logits)`` sets every forbidden token's logit to -inf in the k + 1 rows the
   target scored (the prompt's pass: its one row): the acceptance rule then sees the
   *masked* target distribution;
3. ``commit(drafted, accepted, token)`` rolls the matcher back to the accepted prefix
   and adds the token the target chose (a correction or the bonus, allowed by its mask).

Speculative sampling with the masked target p and any draft q is exact for the masked
distribution, which is what constrained plain decoding samples from; greedy constrained
output equals greedy constrained decoding token for token. A draft model drafts from its
own masked distribution (``mask_next``/``advance``/``rewind``), so its q proposes only
allowed tokens.

Grammars are compiled once per model and schema (``GrammarCompiler`` caches them); a
matcher and its bitmask are per request. The constraint times its own work on the
verify side (``cut``, ``mask``, ``commit``: ``Constraint.seconds``), the one place the
request's ``SpecStats.grammar_s`` comes from.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from speculative_llm.engine.request.timed import timed
from speculative_llm.errors import ConfigError, MissingDependencyError
from speculative_llm.json_gbnf import JSON_WHITESPACE

if TYPE_CHECKING:
    from speculative_llm.engine.request.llama_grammar import LlamaGrammarVocabulary

__all__ = [
    "JSON_WHITESPACE",
    "Constraint",
    "GrammarConstraint",
    "GrammarVocabulary",
    "grammar_vocabulary_for",
    "response_format_grammar",
]


# xgrammar's messages start with a time and a C++ source location ("[02:24:43]
# /project/cpp/json_schema_converter.cc:5082: Unsupported type ...") and end with a
# newline: neither says anything to a user, and the newline cut the hint after it.
_NATIVE_PREFIX = re.compile(r"^\s*(?:\[\d{2}:\d{2}:\d{2}\]\s*)?(?:\S+\.(?:cc|cpp|h):\d+:\s*)?")


def _native_reason(error: BaseException) -> str:
    """The reason xgrammar gives, in one line, without its time stamp and source location."""
    reason = " ".join(_NATIVE_PREFIX.sub("", str(error)).split())
    return reason.rstrip(".") or type(error).__name__


def _apply_bitmask(
    logits: npt.NDArray[np.float32], bitmask: npt.NDArray[np.int32], vocab_size: int
) -> None:
    """Set to -inf, in place, the logits of the first ``vocab_size`` columns whose bit is 0.

    ``bitmask`` is xgrammar's: one int32 word per 32 tokens, token ``t`` at bit ``t % 32``
    of word ``t // 32`` (little-endian words, so the bytes unpack least bit first).
    """
    width = min(vocab_size, logits.shape[-1])
    bits = np.unpackbits(bitmask.astype("<i4").view(np.uint8), axis=-1, bitorder="little")
    logits[:, :width][bits[:, :width] == 0] = -np.inf


class GrammarConstraint(Protocol):
    """What the loop, the session and the drafters ask of a constraint.

    ``Constraint`` (xgrammar) and ``llama_grammar.LlamaConstraint`` (llama.cpp's grammar
    sampler) are both one (see the module docstring).
    """

    cut_tokens: int
    seconds: float

    @property
    def finished(self) -> bool:
        """Whether the grammar has accepted a stop token."""
        ...

    def cut(self, draft_tokens: Sequence[int]) -> int:
        """Follow a proposal; how many leading tokens the grammar allows."""
        ...

    def mask(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Forbidden tokens' logits at -inf, in place, in the rows ``cut`` prepared."""
        ...

    def commit(self, num_accepted: int, token: int | None) -> None:
        """Keep the accepted drafts and add the target's token."""
        ...

    def stops(self, token: int) -> bool:
        """Whether ``token`` is a stop token of the grammar."""
        ...

    def mask_next(self, logits: npt.NDArray[np.float32]) -> None:
        """For a draft model: mask one row for the next position, in place."""
        ...

    def advance(self, token: int) -> None:
        """For a draft model: move past a drafted token."""
        ...

    def rewind(self) -> None:
        """Undo what drafting advanced."""
        ...


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as error:
        # xgrammar itself, or what it imports (torch, transformers, triton).
        raise MissingDependencyError(
            error.name or "xgrammar",
            "grammar",
            "Structured output and tool calling on the local engine (response_format, tools)",
        ) from error
    return xgrammar


class GrammarVocabulary:
    """A model's vocabulary as xgrammar sees it, and the compiler of its grammars.

    Args:
        encoded_vocab: Every token's bytes by id, as the model emits them (control
            tokens empty: the grammar never allows them inside the text).
        vocab_size: Width of the model's logits (at least ``len(encoded_vocab)``).
        stop_token_ids: Tokens that end a generation (allowed once the grammar is done).
        hf_tokenizer: A Hugging Face tokenizer to take the vocabulary from instead
            (xgrammar decodes its byte-level or SentencePiece spelling itself).
    """

    def __init__(
        self,
        encoded_vocab: Sequence[bytes] | None,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        *,
        hf_tokenizer: Any = None,
    ) -> None:
        xgr = _xgrammar()
        stops = sorted(set(stop_token_ids))
        if hf_tokenizer is not None:
            info = xgr.TokenizerInfo.from_huggingface(
                hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stops
            )
        else:
            assert encoded_vocab is not None
            info = xgr.TokenizerInfo(
                list(encoded_vocab),
                xgr.VocabType.RAW,
                vocab_size=vocab_size,
                stop_token_ids=stops,
            )
        self.vocab_size = vocab_size
        self.stop_token_ids = frozenset(stops)
        self._compiler = xgr.GrammarCompiler(info)
        self._lock = threading.Lock()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int) -> GrammarVocabulary:
        """The grammar vocabulary of a local engine tokenizer (Hugging Face or llama.cpp)."""
        stops = sorted(tokenizer.eos_token_ids)
        hf_tokenizer = getattr(tokenizer, "hf_tokenizer", None)
        if hf_tokenizer is not None:
            return cls(None, vocab_size, stops, hf_tokenizer=hf_tokenizer)
        return cls(tokenizer.text_pieces(), vocab_size, stops)

    def constraint(self, compiled: Any, max_rows: int) -> Constraint:
        """One generation's constraint under ``compiled``, masking up to ``max_rows`` rows."""
        return Constraint(compiled, self, max_rows)

    def json_schema(self, schema: Mapping[str, Any] | str) -> Any:
        """The compiled grammar of a JSON schema (keys in the schema's order).

        Up to ``JSON_WHITESPACE`` whitespace characters may separate JSON tokens, as
        llama-server's schema grammars allow: forcing one compact layout pushes small
        models off their own formatting and into loops inside strings.

        Raises:
            ConfigError: The schema is not valid JSON, or uses a construct xgrammar does
                not support (the message has xgrammar's words for it).
        """
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=False)
        try:
            json.loads(text)
        except ValueError as error:
            raise ConfigError(
                f"The JSON schema is not valid JSON ({error}): pass a JSON object.",
                field="response_format",
            ) from error
        with self._lock:
            try:
                return self._compiler.compile_json_schema(
                    text, any_whitespace=True, max_whitespace_cnt=JSON_WHITESPACE
                )
            except (RuntimeError, ValueError, TypeError) as error:
                raise ConfigError(
                    f"The JSON schema cannot be turned into a grammar: {_native_reason(error)}. "
                    "Simplify the schema (xgrammar supports objects, arrays, strings, numbers, "
                    "enums, const, anyOf/oneOf and local $ref), or ask without a schema.",
                    field="response_format",
                ) from error

    def any_json(self) -> Any:
        """The compiled grammar of any JSON value (``response_format`` ``json_object``)."""
        with self._lock:
            return self._compiler.compile_builtin_json_grammar()

    def regex(self, pattern: str) -> Any:
        """The compiled grammar of a regular expression.

        Raises:
            ConfigError: xgrammar cannot compile the pattern.
        """
        with self._lock:
            try:
                return self._compiler.compile_regex(pattern)
            except (RuntimeError, ValueError) as error:
                raise ConfigError(
                    "The regular expression cannot be turned into a grammar: "
                    f"{_native_reason(error)}.",
                    field="response_format",
                ) from error

    def ebnf(self, grammar: str) -> Any:
        """The compiled grammar of an EBNF (GBNF-style) grammar with a ``root`` rule.

        Raises:
            ConfigError: xgrammar cannot parse the grammar.
        """
        xgr = _xgrammar()
        with self._lock:
            try:
                return self._compiler.compile_grammar(xgr.Grammar.from_ebnf(grammar))
            except (RuntimeError, ValueError) as error:
                raise ConfigError(
                    f"The grammar cannot be compiled: {_native_reason(error)}.",
                    field="response_format",
                ) from error


class Constraint:
    """One generation's progress through a grammar (see the module docstring).

    Args:
        compiled: A grammar compiled by ``GrammarVocabulary``.
        vocabulary: The vocabulary it was compiled for.
        max_rows: Most rows a pass scores (the prompt's one, or k + 1).
    """

    def __init__(self, compiled: Any, vocabulary: GrammarVocabulary, max_rows: int) -> None:
        xgr = _xgrammar()
        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(
            compiled, override_stop_tokens=sorted(vocabulary.stop_token_ids)
        )
        self._vocab_size = vocabulary.vocab_size
        self._stop_tokens = vocabulary.stop_token_ids
        self._bitmask = xgr.allocate_token_bitmask(max(1, max_rows), vocabulary.vocab_size)
        self._rows = 0
        self._advanced = 0
        self.cut_tokens = 0
        """Draft tokens dropped because the grammar forbids them, over the generation."""
        self.seconds = 0.0
        """Seconds spent cutting drafts, masking rows and following the emitted tokens
        (``cut``, ``mask``, ``commit``), over the generation; a draft model's own
        masking is part of its drafting time."""

    @property
    def finished(self) -> bool:
        """Whether the grammar has accepted a stop token (nothing more may follow)."""
        return bool(self._matcher.is_terminated())

    @property
    def complete(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar."""
        return bool(self._matcher.is_completed())

    def _fill(self, row: int) -> None:
        if row >= self._bitmask.shape[0]:
            grown = self._xgr.allocate_token_bitmask(row + 1, self._vocab_size)
            grown[: self._bitmask.shape[0]] = self._bitmask
            self._bitmask = grown
        self._matcher.fill_next_token_bitmask(self._bitmask, row)

    def _allows(self, row: int, token: int) -> bool:
        """Whether the filled mask of ``row`` allows ``token`` (bit ``token`` of the row)."""
        if not 0 <= token < self._vocab_size:
            return False
        word = int(self._bitmask[row, token >> 5])
        return bool((word >> (token & 31)) & 1)

    @timed
    def cut(self, draft_tokens: Sequence[int]) -> int:
        """Advance through a proposal; return how many leading tokens the grammar allows.

        Fills the bitmask for every position to be verified (one more than the tokens
        kept). The matcher is left after the kept tokens until ``commit``.
        """
        kept = 0
        self._fill(0)
        for token in draft_tokens:
            # A drafted stop token is left to the target (its row allows it when the
            # grammar may end): past it the matcher would have no next position to mask.
            # The row's mask is read first: the matcher warns on every special token
            # (a prompt's template tokens, which prompt lookup drafts) it is offered.
            if (
                token in self._stop_tokens
                or not self._allows(kept, token)
                or not self._matcher.accept_token(int(token))
            ):
                break
            kept += 1
            self._fill(kept)
        self._rows = kept + 1
        self._advanced = kept
        self.cut_tokens += len(draft_tokens) - kept
        return kept

    @timed
    def mask(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Forbidden tokens' logits set to -inf, in place, in the rows ``cut`` prepared.

        One row with none prepared (the prompt's pass) is the next position's.
        """
        rows = logits.shape[0]
        if rows == 1 and self._rows == 0:
            self._fill(0)
            self._rows = 1
        if rows > self._rows:
            raise RuntimeError(f"{rows} logit rows to mask, {self._rows} masks prepared")
        _apply_bitmask(logits, self._bitmask[:rows].numpy(), self._vocab_size)
        return logits

    @timed
    def commit(self, num_accepted: int, token: int | None) -> None:
        """Keep the accepted drafts and add the target's token (None: the step ended at EOS).

        Raises:
            RuntimeError: The token breaks the grammar (its row was not masked).
        """
        if num_accepted > self._advanced:
            raise RuntimeError("more drafts accepted than the grammar advanced through")
        if self._advanced > num_accepted:
            self._matcher.rollback(self._advanced - num_accepted)
        self._advanced = 0
        self._rows = 0
        if token is not None and not self._matcher.accept_token(int(token)):
            raise RuntimeError(f"token {token} breaks the grammar: the logits were not masked")

    def stops(self, token: int) -> bool:
        """Whether ``token`` is one of the stop tokens the grammar ends with."""
        return token in self._stop_tokens

    def mask_next(self, logits: npt.NDArray[np.float32]) -> None:
        """For a draft model: mask a row of its logits for the next position, in place."""
        self._fill(0)
        _apply_bitmask(logits[None], self._bitmask[:1].numpy(), self._vocab_size)

    def advance(self, token: int) -> None:
        """For a draft model: move past a drafted token (``rewind`` undoes it).

        Raises:
            RuntimeError: The token breaks the grammar (its logits were not masked).
        """
        if token in self._stop_tokens or not self._matcher.accept_token(int(token)):
            raise RuntimeError(f"draft token {token} breaks the grammar or ends it")
        self._advanced += 1

    def rewind(self) -> None:
        """Undo what drafting advanced (``cut`` then walks the proposal again)."""
        if self._advanced:
            self._matcher.rollback(self._advanced)
        self._advanced = 0


def grammar_vocabulary_for(
    tokenizer: Any, vocab_size: int
) -> GrammarVocabulary | LlamaGrammarVocabulary:
    """The grammar vocabulary of a local engine tokenizer: xgrammar's where it imports.

    Without xgrammar (a ``[local]`` install: it needs torch), a llama.cpp model's
    grammars run on llama.cpp's own grammar sampler (``llama_grammar``).

    Raises:
        MissingDependencyError: No xgrammar, and a model that is not llama.cpp's.
    """
    from speculative_llm.engine.runners.llama_cpp.model import LlamaCppTokenizer

    try:
        _xgrammar()
    except MissingDependencyError:
        if not isinstance(tokenizer, LlamaCppTokenizer):
            raise
        from speculative_llm.engine.request.llama_grammar import LlamaGrammarVocabulary

        return LlamaGrammarVocabulary.for_tokenizer(tokenizer, vocab_size)
    return GrammarVocabulary.for_tokenizer(tokenizer, vocab_size)


def response_format_grammar(
    response_format: Mapping[str, Any] | None,
    vocabulary: GrammarVocabulary | LlamaGrammarVocabulary,
) -> Any:
    """The compiled grammar an OpenAI-style ``response_format`` asks for (None: free text).

    ``{"type": "json_schema", "json_schema": {"schema": {...}}}`` constrains the output to
    the schema; ``{"type": "json_object"}`` to any JSON value; ``{"type": "text"}`` and
    None leave it free.

    Raises:
        ConfigError: Another type, a ``json_schema`` without a schema, or a schema
            xgrammar cannot compile.
    """
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return vocabulary.any_json()
    if kind == "json_schema":
        wrapper = response_format.get("json_schema")
        schema = wrapper.get("schema") if isinstance(wrapper, Mapping) else None
        if not isinstance(schema, Mapping | str):
            raise ConfigError(
                "response_format json_schema needs {'json_schema': {'name': ..., 'schema': "
                "{...}}} with the JSON schema under 'schema'.",
                field="response_format",
            )
        return vocabulary.json_schema(schema)
    raise ConfigError(
        f"Unknown response_format type {kind!r}: use 'json_schema', 'json_object' or 'text'.",
        field="response_format",
    )
