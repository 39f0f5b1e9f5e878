"""GGUF models on llama.cpp: loading, the weight layout and threads, the vocabulary.

llama.cpp repacks some quantisation types (Q4_0, Q4_K, IQ4_NL...) into interleaved
layouts whose batched kernels are faster but sum in another order than its one-token
kernels, and on Intel CPUs with AMX its repacked layout runs kernels that crash
(llama.cpp issue 20824). With several threads, llama.cpp also decodes one token past a
cache length by splitting the attention over the keys (split-KV), which rounds unlike
its batched kernels. So each layout is probed once per model file, library, CPU and
thread count, in a child process (``layout_probe``): whether it survives, how many rows
a verify pass scores bitwise equal to one-token passes, and where split-KV begins. The
results are cached on disk (``llama-cpp-probes.json`` in the model cache) and logged.

The exactness policy (``exact``) decides what is done with them:

- ``distribution`` (default): every pass on every thread, as plain llama.cpp decodes,
  any draft length; the layout is llama.cpp's default unless it crashed here. Output
  is distributed exactly as the target's under the kernels that scored each token
  (what every serving engine guarantees); greedy text may differ from a baseline only
  where two tokens' logits tie within rounding.
- ``bitwise``: token-identical to the baseline: the layout with more exact rows, verify
  passes of at most that many rows, and one-token passes on one thread from the cache
  length where split-KV begins.
"""

from __future__ import annotations

import ctypes
import logging
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from speculative_llm.children import signal_name
from speculative_llm.config import EXACT_POLICIES
from speculative_llm.cpu_features import has_amx
from speculative_llm.engine.models.tokenizers import render_chat_template
from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib
from speculative_llm.engine.runners.llama_cpp.batch import LlamaCppBatchRunner
from speculative_llm.engine.runners.llama_cpp.layout_probe import (
    PROBE_ROWS,
    LayoutProbe,
    cached_probes,
    probe_key,
    probe_layouts,
    record_probes,
)
from speculative_llm.engine.runners.llama_cpp.runner import LlamaCppRunner, ThreadPlan
from speculative_llm.errors import BackendError, ConfigError, ModelNotFoundError
from speculative_llm.types import encode_utf8

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "ExactPolicy",
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

WeightLayout = Literal["auto", "repacked", "plain"]
"""``repacked``: llama.cpp's default (weights repacked for batched kernels where it can);
``plain``: as stored in the file (``--no-repack``); ``auto``: chosen from the probe
(the exactness policy says how)."""

ExactPolicy = Literal["distribution", "bitwise"]
"""How exact speculative output is: see the module docstring."""


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
    def api(self) -> Any:
        """The llama.cpp binding the vocabulary is read through."""
        return self._api

    @property
    def vocab(self) -> Any:
        """The model's ``llama_vocab *`` (llama.cpp's grammar sampler is built over it)."""
        return self._vocab

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


@dataclass(frozen=True, slots=True)
class _Choice:
    """The layout, threads and verify limit chosen from the probes, and why."""

    repacked: bool
    plan: ThreadPlan
    exact_rows: int
    verify_rows_limit: int | None
    reason: str


def _fallback_words(probe: LayoutProbe) -> str:
    """``; past it one-token passes use rescore (one_thread 6.2 ms, rescore 4.1 ms)``."""
    if probe.fallback is None:
        return ""
    timings = ", ".join(f"{name} {ms:.1f} ms" for name, ms in sorted(probe.fallback_ms.items()))
    return f"; past it one-token passes use {probe.fallback} ({timings})"


class LlamaCppModel:
    """A GGUF model loaded by llama.cpp; runners (contexts) are made from it.

    Args:
        path: The ``.gguf`` file.
        name: Name to show in messages (default: the file name).
        threads: CPU threads for decoding (default: ``default_threads()``).
        context_window: Tokens each runner's cache holds (default: the model's
            training context, at most ``DEFAULT_CONTEXT_WINDOW``).
        weight_layout: ``auto``, ``repacked`` or ``plain`` (see ``WeightLayout``).
        exact: ``distribution`` or ``bitwise`` (see ``ExactPolicy``).
        probe_rows: Largest verify pass to probe for exactness.
        vocab_only: Load only the vocabulary (for compatibility checks; no runners).
        probe: Probe the layouts (in a child process, once per machine). False loads
            ``weight_layout`` as it is (``auto``: repacked) without measuring: what the
            probe's own child does.

    Raises:
        ModelNotFoundError: llama.cpp cannot load the file (the message names the file,
            llama.cpp's reason and the ``runner="transformers"`` fallback).
        ConfigError: Invalid ``threads``, ``context_window``, ``weight_layout`` or
            ``exact``, or a ``weight_layout`` that crashes llama.cpp on this CPU.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        threads: int | None = None,
        context_window: int | None = None,
        weight_layout: WeightLayout = "auto",
        exact: ExactPolicy = "distribution",
        probe_rows: int = PROBE_ROWS,
        vocab_only: bool = False,
        probe: bool = True,
    ) -> None:
        if weight_layout not in ("auto", "repacked", "plain"):
            raise ConfigError(
                f"weight_layout must be 'auto', 'repacked' or 'plain', got {weight_layout!r}.",
                field="weight_layout",
            )
        if exact not in EXACT_POLICIES:
            raise ConfigError(
                f"exact must be 'distribution' or 'bitwise', got {exact!r}.", field="exact"
            )
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ConfigError(f"threads must be >= 1, got {threads!r}.", field="threads")
        if context_window is not None and (isinstance(context_window, bool) or context_window < 16):
            raise ConfigError(
                f"context_window must be >= 16, got {context_window!r}.", field="context_window"
            )
        library = llama_cpp_lib.load()
        self.api: Any = library.api
        self.library = library
        self.path = Path(path)
        self.name = name or self.path.name
        self.threads = threads or default_threads()
        self.exact: ExactPolicy = exact
        self._vocab_only = vocab_only
        self._runners: weakref.WeakSet[LlamaCppRunner] = weakref.WeakSet()
        self._batch_runners: weakref.WeakSet[LlamaCppBatchRunner] = weakref.WeakSet()
        self.probes: dict[str, LayoutProbe] = {}
        """What the probe measured of each layout (empty when not probed)."""
        if vocab_only or not probe:
            choice = _Choice(
                repacked=weight_layout != "plain" and not vocab_only,
                plan=ThreadPlan(self.threads),
                exact_rows=1,
                verify_rows_limit=1 if exact == "bitwise" else None,
                reason="not probed",
            )
        else:
            choice = self._choose(weight_layout, probe_rows, context_window)
        loaded = self._load(repacked=choice.repacked)
        self._pointer = loaded.pointer
        self._finalizer = weakref.finalize(self, self.api.llama_model_free, loaded.pointer)
        self.repacked = loaded.repacked
        self.tokenizer = LlamaCppTokenizer(self.api, self._pointer, self)
        self.vocab_size = self.tokenizer.vocab_size
        self.train_context = int(self.api.llama_model_n_ctx_train(self._pointer))
        self.sliding_window = int(self.api.llama_model_n_swa(self._pointer))
        wanted = context_window or min(self.train_context, DEFAULT_CONTEXT_WINDOW)
        self.context_window = min(wanted, self.train_context) if self.train_context else wanted
        self.thread_plan = choice.plan
        """Threads of each pass (one-token passes by cache length)."""
        self.exact_rows = choice.exact_rows
        """Rows one pass scores bitwise equal to one-token passes (the probe's figure)."""
        self.verify_rows_limit = choice.verify_rows_limit
        """Most rows one verify pass scores (None: any, under ``exact="distribution"``)."""
        self.layout_reason = choice.reason
        """Why this layout runs (for logs, the description and the playground)."""
        if probe and not vocab_only:
            logger.info("%s", self.describe())

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
        """One line for logs and the playground: file, layout and why, threads, exactness."""
        limit = (
            "verify passes of any length"
            if self.verify_rows_limit is None
            else f"verify passes of up to {self.verify_rows_limit} rows"
        )
        return (
            f"llama.cpp ({self.library.origin} libllama), {self.name}, {self.layout} weights "
            f"({self.layout_reason}), exact={self.exact!r}: {limit}, "
            f"{self.thread_plan.describe()}"
        )

    # ---- the probe ----------------------------------------------------------------------

    def _probe(
        self, layouts: Sequence[str], rows: int, context_window: int | None, *, full: bool
    ) -> dict[str, LayoutProbe]:
        """Each layout's probe, from the disk cache or a child process.

        A full probe also answers a quick one (``full=False``); not the other way round.
        """
        configuration = (
            str(self.library.path),
            self.library.binding_version,
            self.library.system_info,
            self.threads,
            context_window,
            rows,
        )
        full_keys = {
            layout: probe_key(self.path, layout, (*configuration, "full")) for layout in layouts
        }
        quick_keys = {
            layout: probe_key(self.path, layout, (*configuration, "quick")) for layout in layouts
        }
        found = cached_probes(full_keys)
        if not full:
            found = {**cached_probes(quick_keys), **found}
        missing = [layout for layout in layouts if layout not in found]
        if missing:
            measured = probe_layouts(
                self.path,
                missing,
                threads=self.threads,
                context_window=context_window,
                rows=rows,
                full=full,
            )
            record_probes(self.path, full_keys if full else quick_keys, measured)
            for layout, probe in measured.items():
                logger.info(
                    "llama.cpp %s probe of %s, %s layout, %d threads, in a child process: %s "
                    "(%.1f s)",
                    "full" if full else "quick",
                    self.name,
                    layout,
                    self.threads,
                    f"crashed ({signal_name(probe.crash_signal)})"
                    if probe.crash_signal is not None
                    else f"{probe.exact_rows} exact rows, split-KV from "
                    f"{probe.all_threads_exact_below} cached tokens{_fallback_words(probe)}",
                    probe.seconds,
                )
            found.update(measured)
        return {layout: found[layout] for layout in layouts}

    def _choose(
        self, weight_layout: WeightLayout, rows: int, context_window: int | None
    ) -> _Choice:
        bitwise = self.exact == "bitwise"
        if bitwise:
            # Plain first: it never crashes, so a crash in the repacked layout (probed
            # next, in the same child) loses nothing already measured.
            layouts = ["plain", "repacked"] if weight_layout == "auto" else [weight_layout]
        else:
            # Only whether the repacked layout survives matters; plain always does.
            layouts = [] if weight_layout == "plain" else ["repacked"]
        try:
            self.probes = self._probe(layouts, rows, context_window, full=bitwise)
        except ModelNotFoundError:
            raise
        except BackendError as error:
            return self._unprobed_choice(weight_layout, error)
        usable = {layout: probe for layout, probe in self.probes.items() if probe.usable}
        if weight_layout != "auto" and weight_layout in self.probes and weight_layout not in usable:
            number = self.probes[weight_layout].crash_signal or 0
            raise ConfigError(
                f"weight_layout={weight_layout!r} crashes llama.cpp on this CPU: its probe "
                f"process died by {signal_name(number)} (with repacked weights, llama.cpp's AMX "
                "kernels do on Intel CPUs with AMX: llama.cpp issue 20824). Use "
                "weight_layout='plain' or 'auto'.",
                field="weight_layout",
            )
        if not bitwise and "plain" not in self.probes:
            usable.setdefault("plain", LayoutProbe("plain", exact_rows=1, threads=self.threads))
        if not usable:
            raise BackendError(
                f"Every weight layout of {self.name} crashed llama.cpp on this CPU in its "
                "probe process; load it with runner='transformers'."
            )
        crashed = [layout for layout, probe in self.probes.items() if not probe.usable]
        if not bitwise:
            layout = "repacked" if "repacked" in usable and weight_layout != "plain" else "plain"
        else:  # the layout with more exact rows; llama.cpp's default on a tie
            layout = max(usable, key=lambda name: (usable[name].exact_rows, name == "repacked"))
        probe = usable[layout]
        if weight_layout != "auto":
            reason = "as asked"
        elif crashed:
            number = self.probes[crashed[0]].crash_signal or 0
            reason = (
                f"the {crashed[0]} layout crashed llama.cpp on this CPU ({signal_name(number)} in "
                "its probe process; llama.cpp issue 20824)"
            )
        elif not bitwise:
            reason = "llama.cpp's default"
        else:
            reason = f"more exact rows ({probe.exact_rows})" if len(usable) > 1 else "probed"
        plan = ThreadPlan(
            self.threads,
            exact_below=probe.all_threads_exact_below if bitwise else None,
            fallback=probe.fallback if bitwise and probe.fallback else "one_thread",
        )
        if bitwise and probe.exact_rows < 2:
            logger.warning(
                "%s: no multi-token pass reproduces one-token decoding bitwise, so under "
                "exact='bitwise' speculative requests decode one token per pass.",
                self.name,
            )
        return _Choice(
            repacked=layout == "repacked",
            plan=plan,
            exact_rows=probe.exact_rows,
            verify_rows_limit=probe.exact_rows if bitwise else None,
            reason=reason,
        )

    def _unprobed_choice(self, weight_layout: WeightLayout, error: BackendError) -> _Choice:
        """The safe choice when no probe child could run: no repacking where AMX may crash."""
        amx = has_amx(self.library.system_info)
        repacked = weight_layout == "repacked" or (weight_layout == "auto" and not amx)
        logger.warning(
            "%s: the layout probe could not run (%s); loading the %s layout%s without "
            "measuring it (exact='bitwise' then verifies one token per pass).",
            self.name,
            error,
            "repacked" if repacked else "plain",
            " (this CPU has AMX, whose repacked kernels crash in llama.cpp)" if amx else "",
        )
        bitwise = self.exact == "bitwise"
        return _Choice(
            repacked=repacked,
            plan=ThreadPlan(self.threads, exact_below=0 if bitwise else None),
            exact_rows=1,
            verify_rows_limit=1 if bitwise else None,
            reason="not probed: " + ("AMX CPU" if amx else "llama.cpp's default"),
        )

    # ---- runners ----------------------------------------------------------------------

    def new_runner(self) -> LlamaCppRunner:
        """A context of its own over these weights."""
        if self._vocab_only:
            raise BackendError(f"{self.name} was loaded for its vocabulary only.")
        runner = LlamaCppRunner(self)
        self._runners.add(runner)
        return runner

    def new_batch_runner(self, max_sequences: int) -> LlamaCppBatchRunner:
        """A context of its own holding ``max_sequences`` sequences, scored together.

        Raises:
            ConfigError: ``exact="bitwise"`` (a row's logits depend on the rows beside
                it), or ``max_sequences`` below 1.
        """
        if self._vocab_only:
            raise BackendError(f"{self.name} was loaded for its vocabulary only.")
        if self.exact == "bitwise":
            raise ConfigError(
                "Batching several requests is not bitwise exact (a row's logits depend on "
                "the rows beside it in a pass): use exact='distribution' or max_batch=1.",
                field="max_batch",
            )
        runner = LlamaCppBatchRunner(self, max_sequences)
        self._batch_runners.add(runner)
        return runner

    def close(self) -> None:
        """Free the weights, after the contexts made from them."""
        for batch_runner in list(self._batch_runners):
            batch_runner.close()
        for runner in list(self._runners):
            runner.close()
        self._finalizer()
