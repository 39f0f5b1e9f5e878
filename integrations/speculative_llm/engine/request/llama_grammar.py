"""Grammars on llama.cpp's own grammar sampler: constrained decoding without xgrammar (or torch).

xgrammar imports torch (and pulls transformers and triton, about 2 GB) even for its
matcher, so on a ``[local]`` install the llama.cpp runner constrains with what libllama
already has: ``llama_sampler_init_grammar`` over the model's vocabulary, with GBNF
grammars (JSON schemas converted by llama-cpp-python's port of llama.cpp's converter,
``llama_grammar.json_schema_to_gbnf``). ``LlamaGrammarVocabulary`` and
``LlamaConstraint`` have the interface of ``grammar.GrammarVocabulary`` and
``grammar.Constraint``, so the loop does not know which one runs; where xgrammar is
installed the engine keeps using it (its schema grammars allow the whitespace
llama-server is handed by ``json_gbnf``, and its token masks are precomputed).

The sampler has no rollback: ``cut`` keeps one clone of the sampler per draft position
(``llama_sampler_clone``), and ``commit`` keeps the clone at the accepted length. A
token is only ever accepted after the sampler's own mask allowed it: llama.cpp aborts
the process when a grammar is fed a token it forbids.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from speculative_llm.engine.request.timed import timed
from speculative_llm.errors import ConfigError

__all__ = ["LlamaConstraint", "LlamaGrammarVocabulary"]

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
"""``llama_token_data``: id, logit, p (12 bytes, no padding)."""


class LlamaGrammarVocabulary:
    """A llama.cpp model's vocabulary as its grammar sampler sees it, and its grammars.

    A compiled grammar is its GBNF text: each constraint parses it into a sampler of
    its own (parsing a JSON schema's grammar takes well under a millisecond).

    Args:
        api: The llama.cpp binding (``llama_cpp.llama_cpp``).
        vocab: The model's ``llama_vocab *``.
        vocab_size: Width of the model's logits.
        stop_token_ids: Tokens that end a generation (llama.cpp's end-of-generation
            tokens, which its grammars allow once the text is complete).
        owner: What keeps ``vocab`` alive (the tokenizer, which holds the model).
    """

    def __init__(
        self,
        api: Any,
        vocab: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        owner: Any = None,
    ) -> None:
        self.api = api
        self.vocab = vocab
        self.vocab_size = vocab_size
        self.stop_token_ids = frozenset(stop_token_ids)
        self._owner = owner

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int) -> LlamaGrammarVocabulary:
        """The grammar vocabulary of a ``LlamaCppTokenizer``."""
        return cls(
            tokenizer.api, tokenizer.vocab, vocab_size, sorted(tokenizer.eos_token_ids), tokenizer
        )

    def _checked(self, grammar: str, field: str) -> str:
        sampler = self.api.llama_sampler_init_grammar(self.vocab, grammar.encode("utf-8"), b"root")
        if not sampler:
            raise ConfigError(
                "The grammar cannot be parsed by llama.cpp's GBNF parser (see its log "
                "above); check the rules and that a 'root' rule exists.",
                field=field,
            )
        self.api.llama_sampler_free(sampler)
        return grammar

    def json_schema(self, schema: Mapping[str, Any] | str) -> str:
        """The GBNF grammar of a JSON schema (llama.cpp's converter: its whitespace rules).

        Raises:
            ConfigError: The schema is not valid JSON, or the converter refuses it.
        """
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=False)
        try:
            json.loads(text)
        except ValueError as error:
            raise ConfigError(
                f"The JSON schema is not valid JSON ({error}): pass a JSON object.",
                field="response_format",
            ) from error
        try:
            grammar = json_schema_to_gbnf(text)
        except (ValueError, KeyError, TypeError, AssertionError, NotImplementedError) as error:
            raise ConfigError(
                f"The JSON schema cannot be turned into a grammar: {error}. Simplify the "
                "schema, or install the grammar extra (xgrammar covers more of JSON schema).",
                field="response_format",
            ) from error
        return self._checked(grammar, "response_format")

    def any_json(self) -> str:
        """The GBNF grammar of any JSON value (``response_format`` ``json_object``)."""
        from llama_cpp.llama_grammar import JSON_GBNF

        return self._checked(JSON_GBNF, "response_format")

    def regex(self, pattern: str) -> str:
        """Regular expressions need xgrammar.

        Raises:
            ConfigError: Always: llama.cpp's grammars take GBNF, not regular expressions.
        """
        raise ConfigError(
            f"A regular expression ({pattern!r}) needs the grammar extra (xgrammar): "
            'pip install "speculative-llm[grammar]", or write it as a GBNF grammar.',
            field="response_format",
        )

    def ebnf(self, grammar: str) -> str:
        """A GBNF grammar with a ``root`` rule, checked by llama.cpp's parser.

        Raises:
            ConfigError: llama.cpp cannot parse the grammar.
        """
        return self._checked(grammar, "response_format")

    def constraint(self, compiled: str, max_rows: int) -> LlamaConstraint:
        """One generation's constraint under ``compiled`` (``max_rows``: unused, no buffer)."""
        del max_rows
        return LlamaConstraint(compiled, self)


class LlamaConstraint:
    """One generation's progress through a GBNF grammar, on llama.cpp's grammar sampler.

    The interface of ``grammar.Constraint`` (``cut``, ``mask``, ``commit``; ``mask_next``,
    ``advance``, ``rewind`` for a draft model), with clones in place of rollback.

    Args:
        grammar: GBNF text with a ``root`` rule (``LlamaGrammarVocabulary``'s).
        vocabulary: The vocabulary it is for.
    """

    def __init__(self, grammar: str, vocabulary: LlamaGrammarVocabulary) -> None:
        self._api = vocabulary.api
        self._vocabulary = vocabulary
        self._vocab_size = vocabulary.vocab_size
        self._stop_tokens = vocabulary.stop_token_ids
        base = self._api.llama_sampler_init_grammar(
            vocabulary.vocab, grammar.encode("utf-8"), b"root"
        )
        if not base:
            raise ConfigError("llama.cpp cannot parse the grammar.", field="response_format")
        # _states[i]: the sampler after the committed text and the first i kept drafts.
        self._states: list[Any] = [base]
        self._drafted: list[Any] = []  # a draft model's advance() clones
        self._rows = 0
        self._terminated = False
        self._candidates = np.zeros(self._vocab_size, dtype=_TOKEN_DATA)
        self._candidates["id"] = np.arange(self._vocab_size, dtype=np.int32)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self.cut_tokens = 0
        self.seconds = 0.0

    def __del__(self) -> None:
        free = getattr(self, "_api", None)
        if free is not None:
            for sampler in [*getattr(self, "_states", []), *getattr(self, "_drafted", [])]:
                free.llama_sampler_free(sampler)
            self._states, self._drafted = [], []

    def _apply(self, sampler: Any, candidates: npt.NDArray[Any]) -> None:
        """The sampler's mask, in place: forbidden candidates' logits set to -inf."""
        array = self._api.llama_token_data_array(
            candidates.ctypes.data_as(ctypes.POINTER(self._api.llama_token_data)),
            len(candidates),
            -1,
            False,
        )
        self._api.llama_sampler_apply(sampler, ctypes.byref(array))

    def _allows(self, sampler: Any, token: int) -> bool:
        if not 0 <= token < self._vocab_size:
            return False
        self._one[0] = (token, 0.0, 0.0)
        self._apply(sampler, self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def _after(self, sampler: Any, token: int) -> Any:
        """A clone of ``sampler`` that has accepted ``token`` (which it must allow)."""
        clone = self._api.llama_sampler_clone(sampler)
        self._api.llama_sampler_accept(clone, int(token))
        return clone

    def _drop_drafts(self) -> None:
        for sampler in self._states[1:]:
            self._api.llama_sampler_free(sampler)
        del self._states[1:]

    @property
    def finished(self) -> bool:
        """Whether the grammar has accepted a stop token (nothing more may follow)."""
        return self._terminated

    @property
    def complete(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar."""
        return any(self._allows(self._states[0], token) for token in sorted(self._stop_tokens))

    @timed
    def cut(self, draft_tokens: Sequence[int]) -> int:
        """Follow a proposal; return how many leading tokens the grammar allows."""
        self._drop_drafts()
        kept = 0
        for token in draft_tokens:
            # A drafted stop token is left to the target, as in grammar.Constraint.
            if token in self._stop_tokens or not self._allows(self._states[-1], token):
                break
            self._states.append(self._after(self._states[-1], token))
            kept += 1
        self._rows = kept + 1
        self.cut_tokens += len(draft_tokens) - kept
        return kept

    @timed
    def mask(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Forbidden tokens' logits set to -inf, in place, in the rows ``cut`` prepared.

        One row with none prepared (the prompt's pass) is the next position's.
        """
        rows = logits.shape[0]
        if rows == 1 and self._rows == 0:
            self._rows = 1
        if rows > self._rows:
            raise RuntimeError(f"{rows} logit rows to mask, {self._rows} masks prepared")
        width = min(self._vocab_size, logits.shape[-1])
        for row in range(rows):
            self._mask_row(self._states[row], logits[row], width)
        return logits

    def _mask_row(self, sampler: Any, row: npt.NDArray[np.float32], width: int) -> None:
        candidates = self._candidates[:width]
        candidates["logit"] = row[:width]
        self._apply(sampler, candidates)
        row[:width] = candidates["logit"]

    @timed
    def commit(self, num_accepted: int, token: int | None) -> None:
        """Keep the accepted drafts and add the target's token (None: the step ended at EOS).

        Raises:
            RuntimeError: The token breaks the grammar (its row was not masked).
        """
        if num_accepted >= len(self._states):
            raise RuntimeError("more drafts accepted than the grammar advanced through")
        kept = self._states[num_accepted]
        for position, sampler in enumerate(self._states):
            if position != num_accepted:
                self._api.llama_sampler_free(sampler)
        self._states = [kept]
        self._rows = 0
        if token is None:
            return
        if not self._allows(kept, token):
            raise RuntimeError(f"token {token} breaks the grammar: the logits were not masked")
        self._api.llama_sampler_accept(kept, int(token))
        if token in self._stop_tokens:
            self._terminated = True

    def stops(self, token: int) -> bool:
        """Whether ``token`` is one of the stop tokens the grammar ends with."""
        return token in self._stop_tokens

    def _draft_state(self) -> Any:
        return self._drafted[-1] if self._drafted else self._states[0]

    def mask_next(self, logits: npt.NDArray[np.float32]) -> None:
        """For a draft model: mask a row of its logits for the next position, in place."""
        self._mask_row(self._draft_state(), logits, min(self._vocab_size, logits.shape[-1]))

    def advance(self, token: int) -> None:
        """For a draft model: move past a drafted token (``rewind`` undoes it).

        Raises:
            RuntimeError: The token breaks the grammar (its logits were not masked).
        """
        state = self._draft_state()
        if token in self._stop_tokens or not self._allows(state, token):
            raise RuntimeError(f"draft token {token} breaks the grammar or ends it")
        self._drafted.append(self._after(state, token))

    def rewind(self) -> None:
        """Undo what drafting advanced (``cut`` then walks the proposal again)."""
        for sampler in self._drafted:
            self._api.llama_sampler_free(sampler)
        self._drafted = []
