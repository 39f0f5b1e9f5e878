"""LM Studio backend: per-request draft model and its counts (REST API v0).

Sources (lmstudio-ai/docs): ``1_developer/2_rest/endpoints.md`` (REST API v0:
``POST /api/v0/chat/completions`` and ``/api/v0/completions``, OpenAI-shaped, with a
top-level ``stats`` object: ``tokens_per_second``, ``time_to_first_token`` and
``generation_time`` in seconds, ``stop_reason``) and the API changelog entry of LM Studio
0.3.10 "Speculative Decoding API": a request field ``"draft_model"`` turns speculative
decoding on for that request, and ``stats`` then adds ``draft_model``,
``total_draft_tokens_count``, ``accepted_draft_tokens_count``,
``rejected_draft_tokens_count`` and ``ignored_draft_tokens_count`` (``SpecStats``'s
``draft_tokens``, ``accepted_tokens`` and ``ignored_draft_tokens``; the rejected count
goes in the note). When streaming, the last chunk carries ``usage`` and ``stats``.

Speculation is chosen per request (leave ``draft_model`` out for the baseline); the
draft must share the target's vocabulary (LM Studio lists compatible drafts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Unpack

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.fields import count, non_negative
from speculative_llm.backends.http import EngineHints
from speculative_llm.backends.openai_compat.backend import HTTPOptions, OpenAICompatibleBackend
from speculative_llm.backends.openai_compat.dialect import Dialect
from speculative_llm.backends.openai_compat.requests import Route
from speculative_llm.backends.openai_compat.responses import (
    AnswerFigures,
    RequestContext,
    ResponseSummary,
    with_server_timings,
)
from speculative_llm.errors import ConfigError, SpeculationNotEnabledError
from speculative_llm.stats import SpecStats
from speculative_llm.types import GenerationRequest

__all__ = ["LMStudioBackend", "LMStudioDialect", "lmstudio_stats"]

HINTS = EngineHints(
    engine="LM Studio",
    start_hint=(
        "Start its server with `lms server start` (port 1234) and load a model with "
        "`lms load MODEL`, then check base_url."
    ),
    speculation_hint=(
        "LM Studio speculates per request: give a draft model (draft_model='...', a smaller "
        "model of the target's family; LM Studio 0.3.10 or newer)."
    ),
)


def lmstudio_stats(
    stats: Mapping[str, Any] | None,
    *,
    draft_model: str | None,
    **figures: Unpack[AnswerFigures],
) -> SpecStats:
    """``SpecStats`` from LM Studio's ``stats`` object.

    Args:
        stats: The response's ``stats`` (None when absent).
        draft_model: The draft model the request asked for (None: no speculation).
        **figures: Token counts from ``usage`` and client-measured timings; LM Studio's
            own ``time_to_first_token`` and ``generation_time`` win when it sends them.
    """
    method = "draft_model" if draft_model else "none"
    if not isinstance(stats, Mapping):
        return SpecStats.unavailable(
            "lmstudio",
            method=method,
            note="LM Studio sent no stats object (use the REST API v0 endpoints /api/v0/...)",
            **figures,
        )
    figures = with_server_timings(
        figures,
        ttft_s=non_negative(stats.get("time_to_first_token")),
        decode_s=non_negative(stats.get("generation_time")),
    )
    drafted = count(stats.get("total_draft_tokens_count"))
    accepted = count(stats.get("accepted_draft_tokens_count"))
    if drafted is None and accepted is None:
        if draft_model:
            note = (
                f"LM Studio reported no draft counts although draft model {draft_model!r} was "
                "requested; it may have refused the draft (incompatible vocabulary)"
            )
            return SpecStats.unavailable("lmstudio", method=method, note=note, **figures)
        # No draft model was asked for: plain decoding, nothing was drafted.
        return SpecStats(
            backend="lmstudio",
            method="none",
            source="exact",
            draft_tokens=0,
            accepted_tokens=0,
            note="no draft model: plain decoding",
            **figures,
        )
    used_draft = stats.get("draft_model") if isinstance(stats.get("draft_model"), str) else None
    rejected = count(stats.get("rejected_draft_tokens_count"))
    ignored = count(stats.get("ignored_draft_tokens_count"))
    return SpecStats(
        backend="lmstudio",
        method="draft_model",
        source="exact",
        draft_tokens=drafted,
        accepted_tokens=accepted,
        ignored_draft_tokens=ignored,
        note=(
            f"LM Studio stats (draft model {used_draft or draft_model!r}): "
            f"{rejected if rejected is not None else '?'} drafts rejected, "
            f"{ignored if ignored is not None else '?'} ignored (never verified); LM Studio "
            "reports no step count"
        ),
        **figures,
    )


@dataclass(kw_only=True, eq=False)
class LMStudioDialect(Dialect):
    """LM Studio's REST API v0: a draft model chosen per request, exact draft counts.

    Attributes:
        draft_model: Default draft model key (a request's ``spec`` overrides it).
        require_speculation: Refuse requests that would run without a draft model.
    """

    name: ClassVar[str] = "lmstudio"
    hints: ClassVar[EngineHints] = HINTS
    chat_path: ClassVar[str] = "/api/v0/chat/completions"
    completion_path: ClassVar[str] = "/api/v0/completions"
    confirms_speculation: ClassVar[bool] = True

    draft_model: str | None = None

    def check_options(self) -> None:
        """``draft_model`` is None or a model key."""
        draft = self.draft_model
        if draft is not None and (not isinstance(draft, str) or not draft):
            raise ConfigError(
                f"draft_model must be a model key string, got {draft!r}.", field="draft_model"
            )

    @property
    def capabilities(self) -> Capabilities:
        """Per-request draft model (and baseline) with exact counts; no live stats."""
        return Capabilities.of_server(
            per_request_stats=True,
            methods=frozenset({"none", "draft_model", "server"}),
            per_request_toggle=True,
        )

    def draft_model_for(self, request: GenerationRequest) -> str | None:
        """The draft model a request runs with (None: no speculation)."""
        spec = request.spec
        if spec is None or spec.method == "server":
            return self.draft_model
        if spec.method == "none":
            return None
        return spec.draft_model or self.draft_model

    def check_request(self, request: GenerationRequest, route: Route) -> None:
        """With ``require_speculation``, a draft model must be known."""
        if self.require_speculation and self.draft_model_for(request) is None:
            raise SpeculationNotEnabledError(
                f"This request would run without speculative decoding. {HINTS.speculation_hint}"
            )

    def request_fields(
        self,
        request: GenerationRequest,
        route: Route,
        *,
        stream: bool,
        extra_body: Mapping[str, Any],
    ) -> dict[str, Any]:
        """``draft_model`` when the request speculates (it wins over ``extra_body``'s)."""
        # Not engine_fields: extra_body wins over those, and the request's spec must win.
        body = super().request_fields(request, route, stream=stream, extra_body=extra_body)
        draft = self.draft_model_for(request)
        if draft is not None:
            body["draft_model"] = draft
        return body

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """Exact draft counts from ``stats``."""
        stats = summary.extras.get("stats")
        return lmstudio_stats(
            stats if isinstance(stats, Mapping) else None,
            draft_model=self.draft_model_for(context.request),
            **summary.figures(),
        )


class LMStudioBackend(OpenAICompatibleBackend, dialect=LMStudioDialect):
    """LM Studio's REST API v0 with per-request speculative decoding.

    Args:
        base_url: The server URL (LM Studio listens on ``http://127.0.0.1:1234``).
        draft_model: Default draft model key; a request's ``spec`` overrides it
            (``SpecConfig.baseline()`` sends none, ``method="draft_model"`` sends its own).
        require_speculation: Refuse requests that would run without a draft model.
        **options: ``HTTPOptions``, the connection options of ``OpenAICompatibleBackend``.

    Raises:
        ConfigError: An option is invalid.
    """

    dialect: LMStudioDialect

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:1234",
        *,
        draft_model: str | None = None,
        require_speculation: bool = False,
        **options: Unpack[HTTPOptions],
    ) -> None:
        dialect = LMStudioDialect(draft_model=draft_model, require_speculation=require_speculation)
        super().__init__(base_url, dialect=dialect, **options)

    @property
    def draft_model(self) -> str | None:
        """The default draft model key (None: speculate only when a request names one)."""
        return self.dialect.draft_model

    def draft_model_for(self, request: GenerationRequest) -> str | None:
        """The draft model a request runs with (None: no speculation)."""
        return self.dialect.draft_model_for(request)
