"""``Dialect``: what one serving engine does differently from plain OpenAI (no I/O).

``OpenAICompatibleBackend`` is the one client of every server engine: it checks what it
is given, does the I/O (one transport, the sync and async shells, the auxiliary GETs,
the clock) and asks its dialect for everything that differs between engines:

* where a request goes (``route``: OpenAI chat, OpenAI completions or the engine's own
  endpoint; ``path``) and what the engine refuses (``check_request``);
* a forced tool choice the engine does not enforce (``honours_forced_tool_choice``),
  sent through ``response_format`` instead (``tool_request``);
* the request body (``engine_fields`` adds to OpenAI's bodies, ``native_body`` builds
  the body of the engine's own endpoint);
* what to read off the server around a request (``scrapes``: ``/metrics``, ``/slots``...)
  and what that says about the server (``absorb``);
* the answer, whole (``parse_answer``) or streamed (``decoder``), and its statistics
  (``build_stats``).

This base class is the plain OpenAI dialect (no speculative figures); an engine
subclasses it and overrides only what it does differently. Its class attributes say
what the engine is, its dataclass fields are the engine's own constructor options
(``require_speculation`` is every engine's; the client checks it, the engine's
``check_options`` checks the rest), and fields with ``init=False`` hold what the server
said about itself. Adding an engine is one module with its dialect (and a two-line
backend class naming it) plus one ``BackendEntry`` in ``backends/catalog.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.http import EngineHints, JSONResponse, StreamDecoder
from speculative_llm.backends.openai_compat.requests import (
    Route,
    build_chat_body,
    build_completion_body,
)
from speculative_llm.backends.openai_compat.responses import (
    ParsedResponse,
    PredictionCounts,
    RequestContext,
    ResponseSummary,
    parse_chat_response,
    parse_completion_response,
)
from speculative_llm.backends.openai_compat.stream import DecoderOptions, OpenAIStreamDecoder
from speculative_llm.json_tools import as_json_tool_request, forces_tool_call
from speculative_llm.stats import SpecStats
from speculative_llm.types import GenerationRequest

__all__ = ["Dialect", "Phase"]

Phase = Literal["before", "after"]
"""When an auxiliary GET runs: before the request, or after its answer."""

_NO_FIGURES_NOTE = (
    "this server reports no speculative-decoding figures; timings measured by the client"
)


@dataclass(kw_only=True, eq=False)
class Dialect:
    """A plain OpenAI-compatible server: no acceptance figures; a base for engines.

    Attributes:
        require_speculation: Refuse to run when the server does not speculate (only an
            engine whose ``confirms_speculation`` is True can tell; the client refuses
            True for the others).
    """

    name: ClassVar[str] = "openai"
    """The backend's name (``create_backend``'s, ``SpecStats.backend``)."""
    hints: ClassVar[EngineHints] = EngineHints(
        engine="the OpenAI-compatible server",
        start_hint=(
            "Start one, e.g. `speculative-llm serve` (llama-server) or "
            "`python -m vllm.entrypoints.openai.api_server --model MODEL`, and check base_url."
        ),
        speculation_hint=(
            "Speculative decoding is set when the server starts: llama-server "
            "`--spec-type ngram-simple` (or `-md DRAFT.gguf --spec-type draft-simple`); vLLM "
            '`--speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\'`; '
            "SGLang `--speculative-algorithm EAGLE ...`."
        ),
    )
    """How errors name the engine and say how to start it, or its speculation."""
    chat_path: ClassVar[str] = "/v1/chat/completions"
    completion_path: ClassVar[str] = "/v1/completions"
    native_path: ClassVar[str | None] = None
    """The engine's own endpoint (route ``native``), if it has one."""
    routes: ClassVar[Mapping[str, Route]] = {"chat": "chat", "completion": "completion"}
    """The ``endpoint`` values besides ``auto``, and the route each sends requests to."""
    prompt_route: ClassVar[Route] = "completion"
    """Where ``endpoint="auto"`` sends a prompt request (chat requests go to ``chat``)."""
    confirms_speculation: ClassVar[bool] = False
    """Whether the engine can tell that its server speculates (``require_speculation``)."""
    honours_forced_tool_choice: ClassVar[bool] = True
    """Whether the server constrains the answer to a tool call when ``tool_choice`` forces
    one (``required``, or a named tool), as OpenAI does. An engine whose server may answer
    in text, refuse the choice or write arguments off the schema sets False, and
    ``tool_request`` enforces the choice."""

    require_speculation: bool = False

    def check_options(self) -> None:
        """Raise ``ConfigError`` for an invalid engine option (the client calls it)."""

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The ``endpoint`` values the backend takes."""
        return ("auto", *self.routes)

    @property
    def capabilities(self) -> Capabilities:
        """No acceptance figures or provenance; a ``prediction`` is sent (Predicted Outputs)."""
        return Capabilities.of_server(per_request_stats=False, predicted_outputs=True)

    # ---- requests ----

    def route(self, request: GenerationRequest, endpoint: str) -> Route:
        """Where a request goes with the backend's ``endpoint`` setting."""
        if endpoint == "auto":
            return "chat" if request.is_chat else self.prompt_route
        return self.routes[endpoint]

    def path(self, route: Route, *, stream: bool) -> str:
        """The path of a route."""
        if route == "chat":
            return self.chat_path
        if route == "native":
            assert self.native_path is not None, f"{type(self).__name__} has no native_path"
            return self.native_path
        return self.completion_path

    def check_request(self, request: GenerationRequest, route: Route) -> None:
        """Refuse what the engine cannot do (after the client's own checks)."""

    def tool_request(self, request: GenerationRequest) -> tuple[GenerationRequest, bool]:
        """The request to send, and whether its answer is a JSON tool call to parse.

        A forced tool choice the server does not honour (``honours_forced_tool_choice``
        False) is enforced with the JSON tool protocol of ``json_tools``: the tools are
        described in the system message and ``response_format`` constrains the answer to
        a call (of the named tool alone, for a named choice), which the server's grammar
        follows; ``json_tool_completion`` turns it back into a ``ToolCall``. Any other
        request is sent as it is.

        Raises:
            ConfigError: ``tool_choice`` names no tool of the request.
        """
        if self.honours_forced_tool_choice or not forces_tool_call(request):
            return request, False
        return as_json_tool_request(request)

    def engine_fields(
        self, request: GenerationRequest, route: Route, *, stream: bool
    ) -> dict[str, Any]:
        """The engine's own fields for a request; ``extra_body`` and ``request.extra`` win.

        ``request_fields`` merges them with ``extra_body``; an engine that adds fields
        overrides this one (plain OpenAI adds none).
        """
        return {}

    def request_fields(
        self,
        request: GenerationRequest,
        route: Route,
        *,
        stream: bool,
        extra_body: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Fields added to an OpenAI body: the engine's, then the user's ``extra_body``.

        The request's own ``extra`` is merged after these and wins.
        """
        return {**self.engine_fields(request, route, stream=stream), **extra_body}

    def build_body(
        self,
        request: GenerationRequest,
        route: Route,
        *,
        stream: bool,
        model: str | None,
        extra_body: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The JSON body of a request: OpenAI's, or ``native_body`` on the ``native`` route."""
        if route == "native":
            return self.native_body(request, stream=stream, extra_body=extra_body)
        builder = build_chat_body if route == "chat" else build_completion_body
        fields = self.request_fields(request, route, stream=stream, extra_body=extra_body)
        return builder(request, model=model, stream=stream, extra=fields)

    def native_body(
        self, request: GenerationRequest, *, stream: bool, extra_body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The body of the engine's own endpoint (an engine with a ``native_path`` builds it).

        The engine decides where ``extra_body`` and ``request.extra`` go in its body.
        """
        raise NotImplementedError(
            f"{type(self).__name__} routes requests to 'native' but does not override "
            "native_body to build their body."
        )

    # ---- server facts ----

    def scrapes(self, phase: Phase, context: RequestContext) -> tuple[str, ...]:
        """Auxiliary GETs to run ``before`` a request or ``after`` its answer."""
        return ()

    def absorb(self, phase: Phase, context: RequestContext) -> None:
        """Learn from the GETs of ``phase`` (in ``context.before``/``after``); may raise."""

    # ---- answers ----

    def parse_answer(self, context: RequestContext, response: JSONResponse) -> ParsedResponse:
        """A non-streamed answer's parts (OpenAI's shapes here)."""
        parse = parse_chat_response if context.route == "chat" else parse_completion_response
        return parse(response.data, url=context.url, hints=self.hints)

    def decoder(self, context: RequestContext, options: DecoderOptions) -> StreamDecoder:
        """The decoder of a streamed answer."""
        return OpenAIStreamDecoder(chat=context.route == "chat", **options)

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """The ``SpecStats`` of a finished answer."""
        if context.request.prediction is not None and summary.prediction is not None:
            return self.prediction_stats(summary, summary.prediction)
        return self.timing_stats(summary, note=_NO_FIGURES_NOTE)

    def prediction_stats(self, summary: ResponseSummary, prediction: PredictionCounts) -> SpecStats:
        """Exact figures of a Predicted Outputs answer: the prediction's tokens are the drafts.

        OpenAI bills rejected prediction tokens as completion tokens, so the answer's own
        length is ``completion_tokens - rejected_prediction_tokens``; no step count.
        """
        accepted, rejected = prediction.accepted, prediction.rejected
        figures = summary.figures()
        completion = figures["generated_tokens"]
        if completion is not None and rejected is not None and completion >= rejected:
            figures["generated_tokens"] = completion - rejected
        return SpecStats(
            backend=self.name,
            method="prediction",
            source="exact",
            draft_tokens=None if accepted is None or rejected is None else accepted + rejected,
            accepted_tokens=accepted,
            **figures,
            note=(
                "Predicted Outputs (usage.completion_tokens_details): accepted and rejected "
                "prediction tokens; generated_tokens leaves out the rejected ones, which the "
                "server counts as completion tokens; no step count"
            ),
        )

    def timing_stats(self, summary: ResponseSummary, *, note: str) -> SpecStats:
        """An ``unavailable`` record with token counts and client-side timings."""
        return SpecStats.unavailable(self.name, method="server", note=note, **summary.figures())
