"""GGUF models on llama.cpp: loading, the weight layout that keeps verification exact, vocab.

llama.cpp repacks some quantisation types (Q4_0, Q4_K, IQ4_NL...) into interleaved
layouts whose batched kernels are faster but sum in another order than its one-token
kernels, so a verify pass of several rows would not reproduce one-token decoding
bitwise, and greedy speculative output could drift from the baseline. Which batch sizes
agree also depends on the kernels llama.cpp picks per size and on the CPU. So the model
is probed at load (``exact_verify_rows``) in llama.cpp's default layout, and when that
falls short of ``probe_rows``, again with repacking off (llama-server's ``--no-repack``);
the layout with more exact rows is kept, and the engine never verifies more rows in one
pass than the probe found exact. The result is cached on disk per model file, library
and machine (``llama-cpp-probes.json`` in the model cache), and logged.

Threads matter too: with several threads llama.cpp decodes one token past 512 cached
tokens by splitting the attention over the keys, one chunk per thread, and merging the
chunks (its split-KV path), which rounds differently from the batched kernels. So the
probe also runs at a context past that threshold, and when several threads fall short,
one-token passes run on one thread (``n_threads``) while batches keep them all
(``n_threads_batch``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from speculative_llm.backends.local import llama_cpp_lib
from speculative_llm.backends.local.llama_cpp_runner import LlamaCppRunner, exact_verify_rows
from speculative_llm.backends.local.tokenizers import render_chat_template
from speculative_llm.errors import BackendError, ConfigError, ModelNotFoundError
from speculative_llm.types import encode_utf8

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "LlamaCppModel",
    "LlamaCppTokenizer",
    "WeightLayout",
    "default_threads",
    "encode_utf8",
]

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_WINDOW = 8192
"""Context of a llama.cpp runner unless given (the model's own if smaller): the KV cache
is allocated up front, and some GGUF models declare 128k tokens."""

PROBE_ROWS = 17
"""Rows probed for exactness: a draft of 16 tokens plus the token before it."""

LONG_PROBE_CONTEXT = 600
"""Tokens before the rows of the second probe: past llama.cpp's split-KV threshold (512
cache cells, counted after padding), where one-token passes take another kernel."""

_PROBE_VERSION = 2
"""Part of the probe cache key: results of an older probe are measured again."""

WeightLayout = Literal["auto", "repacked", "plain"]
"""``repacked``: llama.cpp's default (weights repacked for batched kernels where it can);
``plain``: as stored in the file (``--no-repack``); ``auto``: whichever the probe finds
exact for more rows (``repacked`` on a tie)."""


def default_threads() -> int:
    """Threads for llama.cpp: the CPUs this process may use, one per physical core."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    try:
        smt = Path("/sys/devices/system/cpu/smt/active").read_text().strip() == "1"
    except OSError:
        smt = False
    return max(1, available // 2 if smt and available > 1 else available)


class LlamaCppTokenizer:
    """The vocabulary of a llama.cpp model behind the ``Tokenizer`` interface.

    Tokenization is llama.cpp's own (what llama-server does); chat templates stored in
    the GGUF are rendered with ``render_chat_template``.

    Args:
        api: The binding.
        model: The ``llama_model *`` whose vocabulary this reads.
        owner: What keeps ``model`` alive (the ``LlamaCppModel``): held, so the
            vocabulary is never read after the weights are freed.
    """

    def __init__(self, api: Any, model: Any, owner: Any = None) -> None:
        self._api = api
        self._owner = owner
        self._vocab = api.llama_model_get_vocab(model)
        self.vocab_size: int = api.llama_vocab_n_tokens(self._vocab)
        template = api.llama_model_chat_template(model, None)
        self._chat_template = template.decode("utf-8") if template else None
        self._bos_text = self._special_text(api.llama_vocab_bos(self._vocab))
        self._eos_text = self._special_text(api.llama_vocab_eos(self._vocab))
        is_eog = api.llama_vocab_is_eog
        self._eos_token_ids = frozenset(
            token for token in range(self.vocab_size) if is_eog(self._vocab, token)
        )
        self._vocabulary: list[bytes] | None = None

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        return bytes(self._api.llama_vocab_get_text(self._vocab, token) or b"").decode(
            "utf-8", "replace"
        )

    @property
    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``, if it has one."""
        return self._chat_template

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every end-of-generation token of the vocabulary (llama.cpp's ``is_eog``)."""
        return self._eos_token_ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in it are parsed.

        Raises:
            ConfigError: ``text`` cannot be encoded as UTF-8.
        """
        data = encode_utf8(text)
        capacity = len(data) + 8
        for _ in range(2):
            buffer = (self._api.llama_token * capacity)()
            count = self._api.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, add_special_tokens, True
            )
            if count >= 0:
                return list(buffer[:count])
            capacity = -count
        raise BackendError("llama.cpp's tokenizer gave inconsistent sizes.")

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with control tokens left out."""
        if not token_ids:
            return ""
        ids = (self._api.llama_token * len(token_ids))(*token_ids)
        capacity = 16 * len(token_ids) + 16
        for _ in range(2):
            buffer = ctypes.create_string_buffer(capacity)
            size = self._api.llama_detokenize(
                self._vocab, ids, len(token_ids), buffer, capacity, False, False
            )
            if size >= 0:
                return buffer.raw[:size].decode("utf-8", "replace")
            capacity = -size
        raise BackendError("llama.cpp's detokenizer gave inconsistent sizes.")

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of ``messages`` through the GGUF's chat template.

        Raises:
            ConfigError: The model has no chat template, or it refused the messages.
        """
        if self._chat_template is None:
            raise ConfigError(
                "This model has no chat template: send a plain prompt.", field="messages"
            )
        return render_chat_template(
            self._chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._bos_text,
            eos_token=self._eos_text,
        )

    def _pieces(self, special: bool) -> list[bytes]:
        buffer = ctypes.create_string_buffer(256)
        pieces: list[bytes] = []
        for token in range(self.vocab_size):
            size = self._api.llama_token_to_piece(self._vocab, token, buffer, 256, 0, special)
            if size < 0:
                large = ctypes.create_string_buffer(-size)
                size = self._api.llama_token_to_piece(self._vocab, token, large, -size, 0, special)
                pieces.append(large.raw[:size])
            else:
                pieces.append(buffer.raw[:size])
        return pieces

    def vocabulary(self) -> Sequence[bytes]:
        """Each token's bytes as llama.cpp renders it (special tokens as their text)."""
        if self._vocabulary is None:
            self._vocabulary = self._pieces(special=True)
        return self._vocabulary

    def text_pieces(self) -> list[bytes]:
        """Each token's bytes as they appear in decoded text (control tokens empty).

        What a grammar sees: a control token adds nothing to the text, so xgrammar never
        allows one inside it.
        """
        return self._pieces(special=False)


@dataclass(frozen=True, slots=True)
class _Loaded:
    pointer: Any
    repacked: bool


def _probe_cache_path() -> Path:
    from speculative_llm.backends.local.models import model_cache_dir

    return model_cache_dir() / "llama-cpp-probes.json"


_probe_cache_lock = threading.Lock()


class LlamaCppModel:
    """A GGUF model loaded by llama.cpp; runners (contexts) are made from it.

    Args:
        path: The ``.gguf`` file.
        name: Name to show in messages (default: the file name).
        threads: CPU threads for decoding (default: ``default_threads()``).
        context_window: Tokens each runner's cache holds (default: the model's
            training context, at most ``DEFAULT_CONTEXT_WINDOW``).
        weight_layout: ``auto``, ``repacked`` or ``plain`` (see ``WeightLayout``).
        probe_rows: Largest verify pass to probe for exactness.
        vocab_only: Load only the vocabulary (for compatibility checks; no runners).

    Raises:
        ModelNotFoundError: llama.cpp cannot load the file (the message names the file,
            llama.cpp's reason and the ``runner="transformers"`` fallback).
        ConfigError: Invalid ``threads``, ``context_window`` or ``weight_layout``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        threads: int | None = None,
        context_window: int | None = None,
        weight_layout: WeightLayout = "auto",
        probe_rows: int = PROBE_ROWS,
        vocab_only: bool = False,
    ) -> None:
        if weight_layout not in ("auto", "repacked", "plain"):
            raise ConfigError(
                f"weight_layout must be 'auto', 'repacked' or 'plain', got {weight_layout!r}.",
                field="weight_layout",
            )
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ConfigError(f"threads must be >= 1, got {threads!r}.", field="threads")
        library = llama_cpp_lib.load()
        self.api: Any = library.api
        self.library = library
        self.path = Path(path)
        self.name = name or self.path.name
        self.threads = threads or default_threads()
        self.one_token_threads = self.threads
        """Threads of one-token passes (``threads``, or 1 where only that is exact)."""
        self._vocab_only = vocab_only
        self._runners: weakref.WeakSet[LlamaCppRunner] = weakref.WeakSet()
        loaded = self._load(repacked=weight_layout != "plain")
        self._pointer = loaded.pointer
        self._finalizer = weakref.finalize(self, self.api.llama_model_free, loaded.pointer)
        self.tokenizer = LlamaCppTokenizer(self.api, self._pointer, self)
        self.vocab_size = self.tokenizer.vocab_size
        self.train_context = int(self.api.llama_model_n_ctx_train(self._pointer))
        self.sliding_window = int(self.api.llama_model_n_swa(self._pointer))
        wanted = context_window or min(self.train_context, DEFAULT_CONTEXT_WINDOW)
        if not vocab_only and (isinstance(wanted, bool) or wanted < 16):
            raise ConfigError(
                f"context_window must be >= 16, got {wanted!r}.", field="context_window"
            )
        self.context_window = min(wanted, self.train_context) if self.train_context else wanted
        self.repacked = loaded.repacked
        self.exact_rows = 1
        self._spare_runner: LlamaCppRunner | None = None
        if not vocab_only:
            self._choose_layout(weight_layout, probe_rows)

    # ---- loading ----------------------------------------------------------------------

    def _load(self, *, repacked: bool) -> _Loaded:
        params = self.api.llama_model_default_params()
        params.use_extra_bufts = repacked
        params.vocab_only = self._vocab_only
        params.n_gpu_layers = 0
        llama_cpp_lib.clear_errors()
        pointer = self.api.llama_model_load_from_file(str(self.path).encode(), params)
        if not pointer:
            # Quoted, so that a page showing the message can leave llama.cpp's log out.
            reason = llama_cpp_lib.recent_errors() or "no reason given"
            raise ModelNotFoundError(
                f"llama.cpp could not load {self.path}: {reason!r}. If llama.cpp does not "
                "support this model's architecture, load it with runner='transformers' "
                "(Hugging Face transformers, with the gguf package).",
                field="model",
            )
        return _Loaded(pointer, repacked)

    def last_errors(self) -> str:
        """llama.cpp's most recent error lines (for messages)."""
        return llama_cpp_lib.recent_errors()

    @property
    def pointer(self) -> Any:
        """The ``llama_model *``."""
        if not self._finalizer.alive:
            raise BackendError(f"The llama.cpp model {self.name} is closed.")
        return self._pointer

    @property
    def layout(self) -> str:
        """``repacked`` or ``plain``: the weight layout in use."""
        return "repacked" if self.repacked else "plain"

    def describe(self) -> str:
        """One line for logs and the playground: file, layout, exact rows, threads."""
        return (
            f"llama.cpp ({self.library.origin} libllama), {self.name}, {self.layout} weights, "
            f"verify passes exact up to {self.exact_rows} rows, {self.threads} threads"
            + (
                f" ({self.one_token_threads} for one-token passes, which are exact there)"
                if self.one_token_threads != self.threads
                else ""
            )
        )

    # ---- the exactness probe ----------------------------------------------------------

    def _probe_tokens(self, rows: int) -> list[list[int]]:
        """Probes of a prompt and ``rows`` more tokens: short, and past split-KV if it fits.

        Ids spread over the vocabulary, not text: a vocabulary without byte tokens
        cannot encode every text.
        """
        lengths = [min(max(48, rows + 8), self.context_window)]
        if LONG_PROBE_CONTEXT + rows < self.context_window:
            lengths.append(LONG_PROBE_CONTEXT + rows)
        return [
            [(index * 7919 + 13) % self.vocab_size for index in range(length)] for length in lengths
        ]

    def _probe_key(self, repacked: bool, rows: int) -> str:
        stat = self.path.stat()
        parts = (
            str(self.path.resolve()),
            stat.st_size,
            stat.st_mtime_ns,
            str(self.library.path),
            self.library.binding_version,
            self.library.system_info,
            self.threads,
            self.one_token_threads,
            self.context_window,
            repacked,
            rows,
            _PROBE_VERSION,
        )
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]

    def _measure(self, repacked: bool, rows: int) -> int:
        """Exact rows of the loaded layout, from the disk cache or a probe."""
        key = self._probe_key(repacked, rows)
        path = _probe_cache_path()
        with _probe_cache_lock:
            try:
                known = json.loads(path.read_text())
            except (OSError, ValueError):
                known = {}
            if isinstance(known.get(key), int):
                return int(known[key])
            runner = LlamaCppRunner(self)
            exact = min(
                exact_verify_rows(runner, probe, rows) for probe in self._probe_tokens(rows)
            )
            # Keep the probe's context for the first runner the backend asks for.
            if self._spare_runner is not None:
                self._spare_runner.close()
            self._spare_runner = runner
            known[key] = exact
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                scratch = path.with_suffix(f".{os.getpid()}.tmp")
                scratch.write_text(json.dumps(known, indent=1, sort_keys=True))
                os.replace(scratch, path)
            except OSError as error:  # a read-only cache only costs a probe next time
                logger.debug("could not save the llama.cpp probe result: %s", error)
            return exact

    def _choose_layout(self, weight_layout: WeightLayout, rows: int) -> None:
        # The probe's prompt and rows must fit the cache (a tiny context_window).
        rows = max(1, min(rows, self.context_window // 2))
        layouts = [self.repacked, not self.repacked] if weight_layout == "auto" else [self.repacked]
        # All threads for one-token passes first; one thread only where that alone is exact.
        thread_counts = list(dict.fromkeys((self.threads, 1)))
        best: tuple[int, bool, int] | None = None
        for one_token_threads in thread_counts:
            self.one_token_threads = one_token_threads
            for repacked in layouts:
                if repacked != self.repacked:
                    self._replace(self._load(repacked=repacked))
                exact = self._measure(repacked, rows)
                if best is None or exact > best[0]:
                    best = (exact, repacked, one_token_threads)
                if exact >= rows:
                    break
            if best is not None and best[0] >= rows:
                break
        assert best is not None
        exact, repacked, self.one_token_threads = best
        if repacked != self.repacked:
            self._replace(self._load(repacked=repacked))
        elif self._spare_runner is not None and (
            self._spare_runner.one_token_threads != self.one_token_threads
        ):
            self._spare_runner.close()  # made for another configuration than the one kept
            self._spare_runner = None
        self.exact_rows = exact
        logger.info("%s", self.describe())
        if exact < 2:
            logger.warning(
                "%s: no multi-token pass reproduces one-token decoding exactly in either "
                "weight layout, so speculative requests decode one token per pass.",
                self.name,
            )

    def _replace(self, loaded: _Loaded) -> None:
        if self._spare_runner is not None:
            self._spare_runner.close()
            self._spare_runner = None
        self._finalizer()
        self._pointer = loaded.pointer
        self.repacked = loaded.repacked
        self._finalizer = weakref.finalize(self, self.api.llama_model_free, loaded.pointer)
        # The tokenizer reads the vocabulary of the weights it was made with.
        self.tokenizer = LlamaCppTokenizer(self.api, self._pointer, self)

    # ---- runners ----------------------------------------------------------------------

    def new_runner(self) -> LlamaCppRunner:
        """A context of its own over these weights (the probe's, the first time)."""
        if self._vocab_only:
            raise BackendError(f"{self.name} was loaded for its vocabulary only.")
        runner, self._spare_runner = self._spare_runner, None
        if runner is None:
            runner = LlamaCppRunner(self)
        self._runners.add(runner)
        return runner

    def close(self) -> None:
        """Free the weights, after the contexts made from them."""
        for runner in [*self._runners, *([self._spare_runner] if self._spare_runner else [])]:
            runner.close()
        self._spare_runner = None
        self._finalizer()
