"""``LlamaServer``: a real llama-server started, checked and stopped by Python."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Self, TypedDict, Unpack

import httpx

from speculative_llm.engine.models.draft_choice import AUTO_DRAFT, DraftChoice
from speculative_llm.errors import (
    BackendUnavailableError,
    ConfigError,
    ModelNotFoundError,
    SpeculationNotEnabledError,
    VocabularyMismatchError,
)
from speculative_llm.servers.gguf_vocab import check_gguf_draft, pick_gguf_draft
from speculative_llm.servers.llama_flags import (
    build_llama_server_command,
    find_llama_server,
    llama_server_flags,
    normalize_llama_spec_type,
    resolve_gguf,
)
from speculative_llm.servers.process import ManagedServer, _ManagedProcess, format_command
from speculative_llm.servers.repack import RepackChoice, choose_repack

if TYPE_CHECKING:
    from speculative_llm.backends.engines.llamacpp import LlamaCppBackend

__all__ = ["LlamaServer", "LlamaServerOptions"]

logger = logging.getLogger(__name__)

_LLAMA_METHOD_OF_SPEC_TYPE: dict[str, str] = {
    "none": "none",
    "draft-simple": "draft_model",
    "draft-eagle3": "eagle3",
    "draft-mtp": "mtp",
}

# Log lines llama-server prints when it will not use the draft model. b11434
# (common/speculative.cpp, tools/server/server-context.cpp) logs "the target and
# draft vocabs are not compatible" and "failed to initialize speculative decoding
# context: draft model vocab type must match target model to use speculation", then
# keeps serving WITHOUT speculation; builds of 2025 refused to start with "the draft
# model '...' is not compatible with the target model '...'".
_VOCAB_MISMATCH_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"draft model .*is not compatible with the target model", re.IGNORECASE),
    re.compile(r"target and draft vocabs are not compatible", re.IGNORECASE),
    re.compile(r"draft model vocab.* must (?:closely )?match target model", re.IGNORECASE),
)
_SPEC_INIT_FAILED = re.compile(r"failed to initiali[sz]e speculative decoding", re.IGNORECASE)
_BAD_ARGUMENT = re.compile(
    r"(?:error: )?(?:invalid argument|unknown argument|error while handling argument)"
    r"|has been removed|use --spec",
    re.IGNORECASE,
)
_MODEL_LOAD_FAILED = re.compile(r"failed to load (?:the )?(?:draft )?model", re.IGNORECASE)

_PROBE_PROMPT = (
    "Copy the list exactly.\n"
    + "\n".join(f"{n}. apple banana cherry" for n in range(1, 9))
    + "\n"
    + "\n".join(f"{n}. apple banana cherry" for n in range(1, 9))
    + "\n1."
)


class LlamaServerOptions(TypedDict, total=False):
    """The options of a llama-server command line, all optional.

    ``LlamaServer`` takes them as keyword arguments and passes them on to
    ``build_llama_server_command``, whose defaults apply to those not given.

    Attributes:
        draft_model: Draft model (``.gguf`` path, packaged alias or store name) with the
            target's vocabulary; ``"auto"`` picks the smallest GGUF on this machine with
            it (``LlamaServer.draft_choice`` says which and why).
        spec_type: llama-server ``--spec-type`` (``ngram-simple``, ``ngram-mod``,
            ``draft-simple``...; speculative-llm names ``ngram``/``draft_model`` work
            too). Defaults to ``draft-simple`` with a draft model, else no speculation.
        draft_max: Largest draft per step (``--spec-draft-n-max`` for draft models,
            ``--spec-ngram-simple-size-m``... for n-gram types; ``--draft-max`` in older
            builds).
        draft_min: Smallest draft per step.
        ngram_size: Lookup length of n-gram spec types (``--spec-ngram-simple-size-n``...):
            how many trailing tokens must match earlier text before the server drafts.
            None: 3, the local engine's ``ngram_max`` (llama-server's own default, 12
            tokens, rarely matches in short answers; pass 12 to keep it).
        host: Interface to listen on (loopback by default).
        ctx_size: Context size (``--ctx-size``); None keeps the server's default
            (``LlamaServer`` passes 4096 unless told otherwise).
        jinja: Use the model's Jinja chat template (needed for tool calling; default on).
        metrics: Expose the Prometheus ``/metrics`` endpoint (default on).
        threads: CPU threads (``--threads``); None keeps the server's default.
        parallel: Number of slots (``--parallel``); None keeps the server's default.
        repack: Let llama.cpp repack weights (its default). ``LlamaServer`` decides it
            when not given: no repacking where the layout probe saw it crash, or on a
            CPU with AMX with no probe showing it survives (``servers.repack``).
        extra_args: More llama-server arguments, appended as given.
    """

    draft_model: str | os.PathLike[str] | None
    spec_type: str | None
    draft_max: int | None
    draft_min: int | None
    ngram_size: int | None
    host: str
    ctx_size: int | None
    jinja: bool
    metrics: bool
    threads: int | None
    parallel: int | None
    repack: bool
    extra_args: Sequence[str]


class LlamaServer(ManagedServer):
    """A real llama-server started and stopped by Python.

    Args:
        model: ``.gguf`` path or packaged alias (``smollm2-135m``, ``gemma3-270m``).
        port: TCP port; None picks a free one.
        log_path: File the server's output is copied to (a temporary file by default).
        binary: llama-server to run (else see ``find_llama_server``).
        startup_timeout: Seconds to wait for ``/health``.
        verify_speculation: With a draft model, send one probe request after startup
            and raise when no draft token was proposed (llama-server silently serves
            without speculation when it refuses a draft model).
        echo: Stream to copy the log to as well (``sys.stderr`` for a foreground server).
        env: Extra environment variables for the server.
        **options: The command line's options (``LlamaServerOptions``): ``draft_model``,
            ``spec_type``, ``draft_max``, ``draft_min``, ``ngram_size``, ``host``,
            ``ctx_size`` (4096 unless given), ``jinja``, ``metrics``, ``threads``,
            ``parallel``, ``repack`` (decided from this CPU unless given) and
            ``extra_args``.

    Raises:
        VocabularyMismatchError: ``draft_model="auto"`` found no model on this machine
            with the target's vocabulary (the message names each candidate and why).

    Example:
        >>> with LlamaServer("smollm2-135m", spec_type="ngram-simple") as server:  # doctest: +SKIP
        ...     backend = server.backend()
    """

    _name = "llama-server"

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 120.0,
        verify_speculation: bool = True,
        echo: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
        **options: Unpack[LlamaServerOptions],
    ) -> None:
        unknown = sorted(set(options) - LlamaServerOptions.__optional_keys__)
        if unknown:  # as Python says it for a keyword outside the signature
            raise TypeError(
                f"LlamaServer.__init__() got an unexpected keyword argument {unknown[0]!r}"
            )
        super().__init__(
            host=options.get("host", "127.0.0.1"),
            port=port,
            log_path=log_path,
            startup_timeout=startup_timeout,
            echo=echo,
            env=env,
        )
        self.binary = find_llama_server(binary)
        self.flags = llama_server_flags(self.binary)
        self.model_path = resolve_gguf(model, role="model")
        draft_model = options.get("draft_model")
        self.draft_choice: DraftChoice | None = None
        """What ``draft_model="auto"`` picked, and why (None: the draft was named)."""
        if draft_model is not None and str(draft_model).strip() == AUTO_DRAFT:
            # Picked from the GGUF headers now, so the command line names a real file.
            self.draft_choice = pick_gguf_draft(self.model_path, target_name=str(model))
            logger.info("llama-server draft_model='auto': %s", self.draft_choice.reason)
            draft_model = self.draft_choice.path
        self.draft_model_path = (
            None if draft_model is None else resolve_gguf(draft_model, role="draft_model")
        )
        spec_type = options.get("spec_type")
        self.spec_type = None if spec_type is None else normalize_llama_spec_type(spec_type)
        if self.spec_type == "none" and self.draft_model_path is None:
            self.spec_type = None
        if self.spec_type is None and self.draft_model_path is not None:
            self.spec_type = "draft-simple"
        if "repack" in options:
            self.repack = RepackChoice(bool(options["repack"]), "as asked")
        else:
            models = [self.model_path] + (
                [] if self.draft_model_path is None else [self.draft_model_path]
            )
            self.repack = choose_repack(models)
        """Whether the weights are repacked, and why (logged when the server starts)."""
        self.options: LlamaServerOptions = {
            "ctx_size": 4096,
            **options,
            "draft_model": self.draft_model_path,
            "spec_type": self.spec_type,
            "repack": self.repack.repack,
            "extra_args": tuple(options.get("extra_args", ())),
        }
        """The command line's options, the models resolved and the spec type normalised."""
        self.verify_speculation = verify_speculation
        # Validate the whole configuration now, before any process starts.
        self._command(port or 8080)

    @property
    def speculative(self) -> bool:
        """Whether the server was asked to speculate."""
        return self.spec_type is not None and self.spec_type != "none"

    @property
    def method(self) -> str:
        """The speculative-llm method name of this server's speculation."""
        if not self.speculative:
            return "none"
        assert self.spec_type is not None
        first = self.spec_type.split(",")[0]
        return _LLAMA_METHOD_OF_SPEC_TYPE.get(
            first, "ngram" if first.startswith("ngram") else "server"
        )

    def _command(self, port: int) -> list[str]:
        return build_llama_server_command(
            self.binary, self.flags, model=self.model_path, port=port, **self.options
        )

    def start(self) -> Self:
        """Start the server and wait until it is healthy (see ``ManagedServer.start``).

        A draft model whose vocabulary differs from the target's is refused first, from
        the two GGUF headers, before either model loads.

        Raises:
            VocabularyMismatchError: The draft cannot draft for the target.
            BackendUnavailableError: The process exited while starting (log tail shown).
            BackendTimeoutError: It was not healthy within ``startup_timeout``.
        """
        if self.draft_model_path is not None and not self.running:
            check_gguf_draft(self.model_path, self.draft_model_path)
        logger.info("llama-server for %s: %s", self.model_path.name, self.repack.reason)
        return super().start()

    def _crash_hint(self) -> str:
        if self.repack.repack:
            return (
                "If this CPU is an Intel Xeon with AMX, llama.cpp's repacked weights crash "
                "there (llama.cpp issue 20824): start the server with repack=False "
                "(--no-repack)."
            )
        return "It ran without repacked weights; its log says where it died."

    def _speculation_failure(self, lines: Sequence[str]) -> Exception | None:
        """The error to raise when the log shows llama-server gave up speculation."""
        if not self.speculative:
            return None
        if self.draft_model_path is not None:
            for line in lines:
                if any(pattern.search(line) for pattern in _VOCAB_MISMATCH_PATTERNS):
                    return VocabularyMismatchError(
                        f"llama-server refused the draft model {str(self.draft_model_path)!r} "
                        f"for target {str(self.model_path)!r}: their vocabularies differ, so it "
                        f"would serve WITHOUT speculation. Server log: {line.strip()!r}. Use a "
                        "draft model with the target's tokenizer (same model family), or "
                        "spec_type='ngram-simple', which needs no draft model.",
                        field="draft_model",
                    )
        for line in lines:
            if _SPEC_INIT_FAILED.search(line):
                return SpeculationNotEnabledError(
                    f"llama-server could not set up speculative decoding (--spec-type "
                    f"{self.spec_type}) and would serve without it. Server log: "
                    f"{line.strip()!r}. Full log: {self.log_path}"
                )
        return None

    def _exit_error(self, managed: _ManagedProcess, code: int) -> Exception:
        lines = managed.log_lines()
        failure = self._speculation_failure(lines)
        if failure is not None:
            return failure
        bad = next((line for line in lines if _BAD_ARGUMENT.search(line)), None)
        if bad is not None:
            return ConfigError(
                f"llama-server rejected its command line: {bad.strip()!r}. Command: "
                f"{format_command(managed.command)}. Log: {managed.log_path}",
                field="extra_args",
            )
        failed = next((line for line in lines if _MODEL_LOAD_FAILED.search(line)), None)
        if failed is not None:
            return ModelNotFoundError(
                f"llama-server could not load a model: {failed.strip()!r}. Check that the "
                f".gguf file is complete and supported by this build. Log: {managed.log_path}\n"
                f"Last log lines:\n{managed.log_tail(15)}",
                field="model",
            )
        return super()._exit_error(managed, code)

    def _after_healthy(self) -> None:
        """Raise when the server gave up the speculation it was asked for.

        Evidence, cheapest first: refusal lines in the log; ``GET /slots``, whose slots
        say ``"speculative": false`` when no drafter could be set up; and, with a draft
        model, a probe request that must report drafted tokens.
        """
        if not self.speculative:
            return
        assert self._managed is not None
        failure = self._speculation_failure(self._managed.log_lines())
        if failure is not None:
            raise failure
        if self._slots_speculative() is False:
            raise SpeculationNotEnabledError(
                f"llama-server was started with --spec-type {self.spec_type} but its /slots "
                "endpoint says no slot speculates, so it is serving without speculation. Check "
                f"the log for why: {self.log_path}\nLast log lines:\n{self._managed.log_tail(15)}"
            )
        if not (self.verify_speculation and self.draft_model_path is not None):
            return
        draft_n = self._probe_draft_tokens()
        # Some builds set the draft up on the first request: read the log again.
        failure = self._speculation_failure(self._managed.log_lines())
        if failure is not None:
            raise failure
        if not draft_n:
            raise SpeculationNotEnabledError(
                f"llama-server started with draft model {str(self.draft_model_path)!r} "
                f"(--spec-type {self.spec_type}) but proposed no draft token on a probe "
                "request, so it is serving without speculation. Check the log for why "
                f"({self._managed.log_path}); pass verify_speculation=False to skip this check."
                f"\nLast log lines:\n{self._managed.log_tail(15)}"
            )

    def _slots_speculative(self) -> bool | None:
        """Whether any slot speculates, per ``GET /slots`` (None when it cannot tell)."""
        try:
            with httpx.Client(timeout=10.0, trust_env=False) as client:
                response = client.get(self.base_url + "/slots")
            slots = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(slots, list):
            return None
        flags = [s.get("speculative") for s in slots if isinstance(s, dict)]
        known = [flag for flag in flags if isinstance(flag, bool)]
        return any(known) if known else None

    def _probe_draft_tokens(self) -> int:
        """Draft tokens proposed for a short, highly predictable completion."""
        url = self.base_url + "/completion"
        body = {"prompt": _PROBE_PROMPT, "n_predict": 24, "temperature": 0.0, "cache_prompt": False}
        try:
            with httpx.Client(timeout=60.0, trust_env=False) as client:
                response = client.post(url, json=body)
                response.raise_for_status()
                timings = response.json().get("timings") or {}
        except (httpx.HTTPError, ValueError) as error:
            raise BackendUnavailableError(
                f"The speculation probe request to {url} failed: {error}", url=url
            ) from error
        return int(timings.get("draft_n") or 0)

    def backend(self, **options: Any) -> LlamaCppBackend:
        """A ``LlamaCppBackend`` talking to this server (options go to its constructor).

        A request that fails because the server died raises ``EngineCrashedError``
        naming the signal.
        """
        from speculative_llm.servers.watched import WatchedLlamaCppBackend

        return WatchedLlamaCppBackend(self.base_url, server=self, **options)

    def _repr_fields(self) -> list[str]:
        draft = None if self.draft_model_path is None else self.draft_model_path.name
        return [
            f"model={self.model_path.name!r}",
            f"spec_type={self.spec_type!r}",
            f"draft_model={draft!r}",
        ]
