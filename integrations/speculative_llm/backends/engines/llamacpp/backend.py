"""``LlamaCppDialect``: requests, server facts and statistics of one llama-server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Unpack

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.engines.llamacpp import facts
from speculative_llm.backends.engines.llamacpp.facts import HINTS, LlamaServerInfo
from speculative_llm.backends.engines.llamacpp.stream import (
    LiveStats,
    LlamaChatDecoder,
    LlamaCompletionDecoder,
)
from speculative_llm.backends.fields import usage_of
from speculative_llm.backends.http import EngineHints, FetchResult, JSONResponse, StreamDecoder
from speculative_llm.backends.openai_compat import responses
from speculative_llm.backends.openai_compat.backend import HTTPOptions, OpenAICompatibleBackend
from speculative_llm.backends.openai_compat.dialect import Dialect, Phase
from speculative_llm.backends.openai_compat.requests import Route, response_schema
from speculative_llm.backends.openai_compat.responses import (
    ParsedResponse,
    RequestContext,
    ResponseSummary,
)
from speculative_llm.backends.openai_compat.stream import DecoderOptions
from speculative_llm.errors import (
    ConfigError,
    SpeculationNotEnabledError,
    UnsupportedFeatureError,
)
from speculative_llm.stats import SpecStats
from speculative_llm.types import GenerationRequest

__all__ = ["LlamaCppBackend", "LlamaCppDialect"]


@dataclass(kw_only=True, eq=False)
class LlamaCppDialect(Dialect):
    """llama-server: OpenAI chat with per-chunk timings, and its native ``/completion``.

    Attributes:
        live_stats: Ask for per-chunk timings while streaming (live stats, provenance).
        require_speculation: Refuse a server that does not speculate.
    """

    name: ClassVar[str] = "llamacpp"
    hints: ClassVar[EngineHints] = HINTS
    native_path: ClassVar[str | None] = "/completion"
    # llama-server's /v1/completions is not used: endpoint="completion" is /completion.
    routes: ClassVar[Mapping[str, Route]] = {"chat": "chat", "completion": "native"}
    prompt_route: ClassVar[Route] = "native"
    confirms_speculation: ClassVar[bool] = True
    # llama-server reads tool_choice as a string (a named function is served as "auto")
    # and enforces "required" only through grammars of chat templates it recognises, which
    # allow text first: forced choices go through response_format (see the package doc).
    honours_forced_tool_choice: ClassVar[bool] = False

    live_stats: bool = True
    _server_info: LlamaServerInfo | None = field(default=None, init=False, repr=False)

    def check_options(self) -> None:
        """``live_stats`` is a bool."""
        if not isinstance(self.live_stats, bool):
            raise ConfigError(
                f"live_stats must be True or False, got {self.live_stats!r}.", field="live_stats"
            )

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

    def check_request(self, request: GenerationRequest, route: Route) -> None:
        """What the native ``/completion`` endpoint cannot carry."""
        if route == "native" and request.response_format is not None:
            kind = request.response_format.get("type")
            if kind not in ("json_object", "json_schema", "text"):
                raise UnsupportedFeatureError(
                    f"response_format type {kind!r} is not supported by llama-server's "
                    "/completion; use 'json_object' or 'json_schema'."
                )

    def engine_fields(
        self, request: GenerationRequest, route: Route, *, stream: bool
    ) -> dict[str, Any]:
        """Sampling as the request says it, timings per token when streaming."""
        # llama-server's defaults (top_k 40, min_p 0.05) would silently change sampling:
        # send the request's own values so top_k=0 means "keep all" as documented.
        body: dict[str, Any] = {"top_k": request.top_k, "min_p": 0.0}
        if stream and self.live_stats:
            body["timings_per_token"] = True
        return body

    def native_body(
        self, request: GenerationRequest, *, stream: bool, extra_body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The native ``/completion`` body of a prompt request."""
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
            schema = response_schema(request.response_format)
            if schema is not None:
                body["json_schema"] = schema
        body.update(self.request_fields(request, "native", stream=stream, extra_body=extra_body))
        body.update(request.extra)
        return body

    # ---- server facts ----

    def scrapes(self, phase: Phase, context: RequestContext) -> tuple[str, ...]:
        """Ask ``/slots`` about speculation once, and again while the drafter is unknown.

        A fresh server's ``/slots`` has no task parameters yet, so the drafter names
        (``speculative.types``) only appear once a request ran.
        """
        info = self._server_info
        if phase == "before":
            return ("/slots",) if info is None else ()
        if info is not None and info.spec_types is None and info.slots_speculative:
            return ("/slots",)
        return ()

    def absorb(self, phase: Phase, context: RequestContext) -> None:
        """Remember the server's speculation facts; enforce ``require_speculation``."""
        if phase == "after":
            slots = context.after.get("/slots")
            if slots is not None and slots.ok and self._server_info is not None:
                types = facts.parse_slots(slots.text).spec_types
                if types is not None:
                    self._server_info = replace(self._server_info, spec_types=types)
            return
        if self._server_info is not None:
            return
        slots_result: FetchResult | None = context.before.get("/slots")
        info = (
            facts.parse_slots(slots_result.text)
            if slots_result is not None and slots_result.ok
            else LlamaServerInfo()
        )
        self._server_info = info
        if self.require_speculation and info.speculation_enabled is False:
            raise SpeculationNotEnabledError(
                f"llama-server at {context.base_url} runs without speculative decoding "
                f"(/slots reports speculative=false). {HINTS.speculation_hint} If it was "
                "started with -md, the draft model was probably refused (a vocabulary "
                "mismatch with the target): see the server log."
            )

    # ---- answers ----

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """Exact figures from the answer's ``timings``."""
        timings = summary.extras.get("timings")
        usage = summary.usage
        info = self.server_info
        method = info.method
        settings = summary.extras.get("generation_settings")  # /completion answers
        if method == "server" and isinstance(settings, Mapping):
            method = facts.method_of_spec_types(
                facts.parse_spec_types(settings.get("speculative.types"))
            )
        stats = facts.llamacpp_stats(
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
            and (stats.generated_tokens or 0) >= facts.NO_SPECULATION_MIN_TOKENS
        ):
            raise SpeculationNotEnabledError(
                f"llama-server at {context.base_url} drafted no token in "
                f"{stats.generated_tokens} generated tokens, and its /slots endpoint could not "
                f"confirm speculation (start it with --slots). {HINTS.speculation_hint}"
            )
        return stats

    def decoder(self, context: RequestContext, options: DecoderOptions) -> StreamDecoder:
        """Chat decoder with per-chunk timings, or the native ``/completion`` decoder."""
        live = LiveStats(self.server_info, self.live_stats)
        if context.route == "chat":
            return LlamaChatDecoder(live=live, **options)
        return LlamaCompletionDecoder(live=live, **options)

    def parse_answer(self, context: RequestContext, response: JSONResponse) -> ParsedResponse:
        """Chat answers as OpenAI; ``/completion`` answers natively."""
        if context.route == "chat":
            return super().parse_answer(context, response)
        data = response.data
        if "error" in data:  # raises the typed error
            responses.parse_completion_response(data, url=context.url, hints=self.hints)
        content = responses.required_text(
            data, "content", url=context.url, answer="/completion answer", server="a llama-server"
        )
        model = data.get("model")
        return ParsedResponse(
            text=content,
            finish_reason=responses.map_finish_reason(data.get("stop_type")),
            tool_calls=(),
            usage=usage_of(data.get("tokens_evaluated"), data.get("tokens_predicted")),
            model=model if isinstance(model, str) else "",
            extras={k: v for k, v in data.items() if k != "content"},
        )


class LlamaCppBackend(OpenAICompatibleBackend, dialect=LlamaCppDialect):
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
        **options: ``HTTPOptions``, the connection options of ``OpenAICompatibleBackend``.

    Raises:
        ConfigError: An option is invalid.
    """

    dialect: LlamaCppDialect

    def __init__(
        self,
        base_url: str,
        *,
        live_stats: bool = True,
        require_speculation: bool = False,
        **options: Unpack[HTTPOptions],
    ) -> None:
        dialect = LlamaCppDialect(live_stats=live_stats, require_speculation=require_speculation)
        super().__init__(base_url, dialect=dialect, **options)

    @property
    def live_stats(self) -> bool:
        """Whether streams ask for per-chunk timings (live stats, provenance)."""
        return self.dialect.live_stats

    @property
    def server_info(self) -> LlamaServerInfo:
        """What the server said about its speculation (empty until the first request)."""
        return self.dialect.server_info
