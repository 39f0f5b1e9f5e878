"""SGLang backend: per-request speculative figures from ``meta_info`` or ``sglext``.

Sources (sgl-project/sglang, python/sglang/srt/):

* ``managers/tokenizer_manager.py`` (``_calculate_spec_decoding_metrics``) puts into the
  native ``/generate`` ``meta_info``: ``spec_verify_ct`` (verify forward passes),
  ``spec_accept_rate`` (correct / proposed drafts, no bonus), ``spec_accept_length``
  (``completion_tokens / spec_verify_ct``, bonus included), and the counts under three
  generations of names: ``spec_num_correct_drafts`` / ``spec_num_proposed_drafts`` (current),
  ``spec_accepted_drafts`` / ``spec_proposed_drafts`` (backward-compatible aliases, "remove
  in next release"), ``spec_accept_token_num`` / ``spec_draft_token_num`` (older releases);
  the histogram of drafts accepted per step as ``spec_correct_drafts_histogram`` (alias
  ``spec_accept_histogram``); newer builds add ``spec_num_correct_drafts_by_position`` and
  ``spec_num_proposed_drafts_by_position``.
* ``entrypoints/openai/protocol.py`` / ``utils.py`` (``spec_tokens_details_from_meta_info``):
  a chat or completion request with ``"return_spec_tokens_details": true`` gets the same
  fields under the top-level ``sglext.spec_tokens_details`` (missing values filled with 0);
  when streaming they come on an extra chunk with ``choices: []`` before the usage chunk.
* ``entrypoints/http_server.py``: ``/generate`` streams ``data: {...}`` events whose ``text``
  is the whole text so far (unless the server runs ``--incremental-streaming-output``) and
  ends with ``data: [DONE]``; ``GET /server_info`` (alias ``/get_server_info``) returns
  the server arguments, among them ``speculative_algorithm`` (null without speculation)
  and ``speculative_num_draft_tokens`` (tokens per verify, the root included).

Speculation cannot be switched off per request; provenance is not reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Unpack

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.fields import count, counts, first_present, usage_of
from speculative_llm.backends.http import EngineHints, JSONResponse, StreamDecoder, error_for_status
from speculative_llm.backends.openai_compat.backend import HTTPOptions, OpenAICompatibleBackend
from speculative_llm.backends.openai_compat.dialect import Dialect, Phase
from speculative_llm.backends.openai_compat.requests import (
    Route,
    response_schema,
    sampling_fields,
)
from speculative_llm.backends.openai_compat.responses import (
    AnswerFigures,
    ParsedResponse,
    RequestContext,
    ResponseSummary,
    map_finish_reason,
)
from speculative_llm.backends.openai_compat.stream import DecoderOptions, StreamDecoderBase
from speculative_llm.errors import ConfigError, MalformedResponseError, SpeculationNotEnabledError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, GenerationRequest, Usage

__all__ = ["SGLangBackend", "SGLangDialect", "parse_server_info", "sglang_stats"]

HINTS = EngineHints(
    engine="SGLang",
    start_hint=(
        "Start one with `python -m sglang.launch_server --model-path MODEL --port 30000`, "
        "then check base_url."
    ),
    speculation_hint=(
        "Start SGLang with `--speculative-algorithm EAGLE` (or EAGLE3, NGRAM, STANDALONE, "
        "MTP) and its draft options, e.g. `--speculative-draft-model-path DRAFT "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4`."
    ),
)

_ALGORITHM_METHODS = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NGRAM": "ngram",
    "LOOKAHEAD": "ngram",
    "STANDALONE": "draft_model",
    "NEXTN": "mtp",
    "MTP": "mtp",
}


# Each figure under its current name, then the backward-compatible alias SGLang still
# writes ("FIXME: backward-compat aliases, remove in next release" in
# tokenizer_manager.py), then the name of releases before the rename.
_CORRECT_DRAFTS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED_DRAFTS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_CORRECT_DRAFTS_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def parse_server_info(payload: Mapping[str, Any] | None) -> tuple[bool | None, str, int | None]:
    """(speculation on?, method, k) from ``/server_info``; unknowns are None / ``server``."""
    if not isinstance(payload, Mapping) or "speculative_algorithm" not in payload:
        return None, "server", None
    algorithm = payload.get("speculative_algorithm")
    if algorithm in (None, "", "None", "NONE"):
        return False, "none", None
    method = _ALGORITHM_METHODS.get(str(algorithm).upper(), "server")
    draft_tokens = count(payload.get("speculative_num_draft_tokens"))
    k = draft_tokens - 1 if draft_tokens else None
    return True, method, k


def sglang_stats(
    details: Mapping[str, Any] | None,
    *,
    method: str = "server",
    num_speculative_tokens: int | None = None,
    **figures: Unpack[AnswerFigures],
) -> SpecStats:
    """``SpecStats`` from SGLang's ``spec_*`` fields (``meta_info`` or ``spec_tokens_details``)."""
    if not isinstance(details, Mapping) or not any(str(k).startswith("spec_") for k in details):
        return SpecStats.unavailable(
            "sglang",
            method=method,
            note=(
                "SGLang sent no spec_* figures: the server may run without speculative "
                f"decoding. {HINTS.speculation_hint}"
            ),
            **figures,
        )
    accepted = count(first_present(details, *_CORRECT_DRAFTS))
    drafted = count(first_present(details, *_PROPOSED_DRAFTS))
    histogram = counts(first_present(details, *_CORRECT_DRAFTS_HISTOGRAM))
    accepted_by_position = counts(details.get("spec_num_correct_drafts_by_position"))
    drafted_by_position = counts(details.get("spec_num_proposed_drafts_by_position"))
    if accepted_by_position is None and histogram is not None:
        # Accepted drafts are a prefix: position i was accepted by every step that
        # accepted more than i drafts.
        accepted_by_position = [
            sum(histogram[j] for j in range(i + 1, len(histogram)))
            for i in range(len(histogram) - 1)
        ]
    if num_speculative_tokens is None and histogram is not None and len(histogram) > 1:
        num_speculative_tokens = len(histogram) - 1
    return SpecStats(
        backend="sglang",
        method=method,
        source="exact",
        num_speculative_tokens=num_speculative_tokens,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_steps=count(details.get("spec_verify_ct")),
        accepted_per_position=tuple(accepted_by_position) if accepted_by_position else None,
        drafted_per_position=tuple(drafted_by_position) if drafted_by_position else None,
        note="spec_verify_ct counted by SGLang (its accept length includes the bonus token)",
        **figures,
    )


class _NativeDecoder(StreamDecoderBase):
    """``/generate`` stream: cumulative (or incremental) ``text`` + ``meta_info``."""

    def __init__(self, *, incremental: bool, **options: Any) -> None:
        super().__init__(**options)
        self._incremental = incremental
        self.meta_info: dict[str, Any] = {}
        self.extras["meta_info"] = self.meta_info

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        text = payload.get("text", "")
        if not isinstance(text, str):
            raise MalformedResponseError(
                f"'text' in a /generate stream event from {self.url} is not a string.",
                url=self.url,
            )
        meta = payload.get("meta_info")
        if isinstance(meta, dict):
            self.meta_info.update(meta)
            reason = meta.get("finish_reason")
            if reason is not None:
                self.finish_reason = map_finish_reason(reason) or "stop"
            usage = _usage_of(meta)
            if usage is not None:
                self.usage = usage
        if self._incremental:
            delta = text
        else:
            so_far = self.text
            if not text.startswith(so_far):
                raise MalformedResponseError(
                    f"SGLang at {self.url} sent stream text that does not extend the text so "
                    "far; if the server runs with --incremental-streaming-output, create the "
                    "backend with native_stream_text='incremental'.",
                    url=self.url,
                    partial_text=so_far,
                )
            delta = text[len(so_far) :]
        if not delta:
            return []
        self.add_text(delta, now)
        return [Chunk(text=delta)]


def _usage_of(meta: Mapping[str, Any]) -> Usage | None:
    return usage_of(meta.get("prompt_tokens"), meta.get("completion_tokens"))


_SERVER_INFO_PATHS = ("/server_info", "/get_server_info")


@dataclass(kw_only=True, eq=False)
class SGLangDialect(Dialect):
    """SGLang: OpenAI routes with ``sglext`` details, and its native ``/generate``.

    Attributes:
        native_stream_text: ``cumulative`` or ``incremental`` ``/generate`` stream text.
        require_speculation: Refuse a server whose ``/server_info`` shows no speculative
            algorithm.
    """

    name: ClassVar[str] = "sglang"
    hints: ClassVar[EngineHints] = HINTS
    native_path: ClassVar[str | None] = "/generate"
    routes: ClassVar[Mapping[str, Route]] = {
        "chat": "chat",
        "completion": "completion",
        "native": "native",
    }
    prompt_route: ClassVar[Route] = "native"
    confirms_speculation: ClassVar[bool] = True

    native_stream_text: str = "cumulative"
    _server: tuple[bool | None, str, int | None] | None = field(
        default=None, init=False, repr=False
    )

    def check_options(self) -> None:
        """``native_stream_text`` is ``cumulative`` or ``incremental``."""
        if self.native_stream_text not in ("cumulative", "incremental"):
            raise ConfigError(
                f"native_stream_text must be 'cumulative' or 'incremental', got "
                f"{self.native_stream_text!r}.",
                field="native_stream_text",
            )

    @property
    def capabilities(self) -> Capabilities:
        """Exact per-request figures at the end; no live stats, no provenance, no toggle."""
        return Capabilities.of_server(per_request_stats=True)

    def engine_fields(
        self, request: GenerationRequest, route: Route, *, stream: bool
    ) -> dict[str, Any]:
        """Ask for ``sglext.spec_tokens_details`` on OpenAI endpoints."""
        return {"return_spec_tokens_details": True}

    def native_body(
        self, request: GenerationRequest, *, stream: bool, extra_body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The native ``/generate`` body of a prompt request."""
        assert request.prompt is not None
        sampling = sampling_fields(request, max_tokens="max_new_tokens", seed="sampling_seed")
        schema = response_schema(request.response_format)
        if schema is not None:
            sampling["json_schema"] = json.dumps(schema)
        body: dict[str, Any] = {
            "text": request.prompt,
            "sampling_params": sampling,
            "stream": stream,
        }
        body.update(extra_body)
        body.update(request.extra)
        return body

    # ---- server facts ----

    def scrapes(self, phase: Phase, context: RequestContext) -> tuple[str, ...]:
        """Read the server arguments once (``/server_info``, older ``/get_server_info``)."""
        return _SERVER_INFO_PATHS if phase == "before" and self._server is None else ()

    def absorb(self, phase: Phase, context: RequestContext) -> None:
        """Remember the speculative algorithm; enforce ``require_speculation``."""
        if phase != "before" or self._server is not None:
            return
        payload = None
        for path in _SERVER_INFO_PATHS:
            result = context.before.get(path)
            payload = result.json_object() if result is not None else None
            if payload is not None:
                break
        self._server = parse_server_info(payload)
        if self.require_speculation and self._server[0] is False:
            raise SpeculationNotEnabledError(
                f"SGLang at {context.base_url} runs without speculative decoding "
                f"(speculative_algorithm is null in /server_info). {HINTS.speculation_hint}"
            )

    # ---- answers ----

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """Exact figures from a native answer's ``meta_info``, else ``sglext``'s details."""
        details = summary.extras.get("meta_info")
        if details is None:
            sglext = summary.extras.get("sglext")
            details = sglext.get("spec_tokens_details") if isinstance(sglext, Mapping) else None
        if isinstance(details, list):  # n > 1: one entry per choice
            details = details[0] if details else None
        method, k = ("server", None) if self._server is None else self._server[1:]
        return sglang_stats(
            details if isinstance(details, Mapping) else None,
            method=method,
            num_speculative_tokens=k,
            **summary.figures(),
        )

    def decoder(self, context: RequestContext, options: DecoderOptions) -> StreamDecoder:
        """The native decoder for ``/generate``, else the OpenAI one."""
        if context.route != "native":
            return super().decoder(context, options)
        return _NativeDecoder(incremental=self.native_stream_text == "incremental", **options)

    def parse_answer(self, context: RequestContext, response: JSONResponse) -> ParsedResponse:
        """Native answers (``text`` + ``meta_info``), else OpenAI parsing."""
        if context.route != "native":
            return super().parse_answer(context, response)
        data = response.data
        if "error" in data:
            raise error_for_status(500, json.dumps(data), url=context.url, hints=self.hints)
        text = data.get("text")
        meta = data.get("meta_info")
        if not isinstance(text, str) or not isinstance(meta, dict):
            raise MalformedResponseError(
                f"The /generate answer from {context.url} lacks 'text' or 'meta_info'; is this "
                "an SGLang server?",
                url=context.url,
            )
        return ParsedResponse(
            text=text,
            finish_reason=map_finish_reason(meta.get("finish_reason")),
            tool_calls=(),
            usage=_usage_of(meta),
            model="",
            extras={"meta_info": meta},
        )


class SGLangBackend(OpenAICompatibleBackend, dialect=SGLangDialect):
    """An SGLang server with exact per-request speculative statistics.

    ``endpoint="auto"`` (default) sends chat requests to ``/v1/chat/completions`` with
    ``return_spec_tokens_details`` and prompt requests to the native ``/generate``;
    ``chat``, ``completion`` (``/v1/completions``) or ``native`` force one.

    Args:
        base_url: The server URL, e.g. ``http://127.0.0.1:30000``.
        native_stream_text: ``cumulative`` (SGLang's default) or ``incremental`` (a server
            started with ``--incremental-streaming-output``).
        require_speculation: Raise ``SpeculationNotEnabledError`` when ``/server_info``
            shows no speculative algorithm.
        **options: ``HTTPOptions``, the connection options of ``OpenAICompatibleBackend``.
            ``endpoint`` also accepts ``native`` (SGLang's ``/generate``).

    Raises:
        ConfigError: An option is invalid.
    """

    dialect: SGLangDialect

    def __init__(
        self,
        base_url: str,
        *,
        native_stream_text: str = "cumulative",
        require_speculation: bool = False,
        **options: Unpack[HTTPOptions],
    ) -> None:
        dialect = SGLangDialect(
            native_stream_text=native_stream_text, require_speculation=require_speculation
        )
        super().__init__(base_url, dialect=dialect, **options)

    @property
    def native_stream_text(self) -> str:
        """How ``/generate`` streams its text: ``cumulative`` or ``incremental``."""
        return self.dialect.native_stream_text
