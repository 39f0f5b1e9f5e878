"""Hugging Face TGI (text-generation-inference) backend: timings, no acceptance figures.

Source: huggingface/text-generation-inference ``router/src/server.rs`` and ``lib.rs``.
TGI speculates with ``--speculate N`` (Medusa heads or n-gram) but reports no per-request
acceptance figures, so statistics have source ``unavailable`` with token counts and
timings:

* native ``POST /generate`` with ``parameters.details: true`` answers
  ``{"generated_text", "details": {"finish_reason": "length"|"eos_token"|"stop_sequence",
  "generated_tokens", "seed", "prefill", "tokens": [{"id", "text", "logprob", "special"}]}}``
  and sets headers ``x-prompt-tokens``, ``x-generated-tokens``, ``x-inference-time`` (ms,
  from the start of inference to the last token, prompt pass included), ``x-queue-time``,
  ``x-time-per-token``;
* ``POST /generate_stream`` sends ``data:{"index", "token": {...}, "generated_text": null,
  "details": null}`` per token and, last, ``generated_text`` and ``details`` (with
  ``input_length``); no ``[DONE]``; errors as ``{"error", "error_type"}``;
* the OpenAI route ``/v1/chat/completions`` (Messages API) streams OpenAI chunks;
* validation: ``temperature`` and ``top_p`` must be strictly inside their ranges, greedy
  decoding is ``do_sample: false``; structured output is the grammar
  ``{"type": "json", "value": schema}`` (``GrammarType``, alias ``json_object``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.fields import count, header_count, usage_of
from speculative_llm.backends.http import EngineHints, JSONResponse, StreamDecoder
from speculative_llm.backends.openai_compat import responses
from speculative_llm.backends.openai_compat.backend import OpenAICompatibleBackend
from speculative_llm.backends.openai_compat.dialect import Dialect
from speculative_llm.backends.openai_compat.requests import Route
from speculative_llm.backends.openai_compat.responses import (
    ParsedResponse,
    RequestContext,
    ResponseSummary,
)
from speculative_llm.backends.openai_compat.stream import DecoderOptions, StreamDecoderBase
from speculative_llm.errors import MalformedResponseError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, GenerationRequest, Token

__all__ = ["TGIBackend", "TGIDialect", "tgi_grammar"]

HINTS = EngineHints(
    engine="TGI",
    start_hint=(
        "Start one with `text-generation-launcher --model-id MODEL --port 8080` (or its Docker "
        "image), then check base_url."
    ),
    speculation_hint=(
        "TGI speculates with `--speculate N` (Medusa heads, or n-gram when the model has "
        "none); it reports no acceptance figures."
    ),
)

_NOTE = (
    "TGI reports no speculative-decoding figures (start it with --speculate N to speculate); "
    "token counts and timings only"
)


def tgi_grammar(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An OpenAI ``response_format`` as TGI's grammar (None for plain text)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return {"type": "json", "value": dict(schema) if isinstance(schema, Mapping) else {}}
    if kind == "json_object":
        return {"type": "json", "value": {"type": "object"}}
    if kind in ("json", "regex"):  # already TGI's shape
        return dict(response_format)
    return None


def _tokens_of(raw: object) -> tuple[Token, ...]:
    """TGI ``details.tokens`` as tokens (special tokens such as EOS are left out)."""
    if not isinstance(raw, list):
        return ()
    tokens = []
    for item in raw:
        if not isinstance(item, dict) or item.get("special") is True:
            continue
        text = item.get("text")
        token_id = item.get("id")
        tokens.append(
            Token(
                text=text if isinstance(text, str) else "",
                provenance="unknown",
                id=token_id
                if isinstance(token_id, int) and not isinstance(token_id, bool)
                else None,
            )
        )
    return tuple(tokens)


class _NativeDecoder(StreamDecoderBase):
    """``/generate_stream``: one event per token, the last one has ``generated_text``."""

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        token = payload.get("token")
        if not isinstance(token, dict):
            raise MalformedResponseError(
                f"A /generate_stream event from {self.url} has no token object.", url=self.url
            )
        text = token.get("text")
        if not isinstance(text, str):
            raise MalformedResponseError(
                f"A token from {self.url} has no text string.", url=self.url
            )
        if payload.get("generated_text") is not None:
            self.mark_done()
            details = payload.get("details")
            if isinstance(details, dict):
                self.finish_reason = (
                    responses.map_finish_reason(details.get("finish_reason")) or "stop"
                )
                usage = usage_of(details.get("input_length"), details.get("generated_tokens"))
                self.usage = usage or self.usage
            else:
                self.finish_reason = "stop"
        if token.get("special") is True:
            return []
        token_id = token.get("id")
        self.add_text(text, now)
        return [
            Chunk(
                text=text,
                tokens=(
                    Token(
                        text=text,
                        provenance="unknown",
                        id=token_id
                        if isinstance(token_id, int) and not isinstance(token_id, bool)
                        else None,
                    ),
                ),
            )
        ]


class TGIDialect(Dialect):
    """TGI: chat through its OpenAI route, prompts through native ``/generate``."""

    name: ClassVar[str] = "tgi"
    hints: ClassVar[EngineHints] = HINTS
    native_path: ClassVar[str | None] = "/generate"
    routes: ClassVar[Mapping[str, Route]] = {"chat": "chat", "native": "native"}
    prompt_route: ClassVar[Route] = "native"

    @property
    def capabilities(self) -> Capabilities:
        """No acceptance figures, no provenance, no per-request toggle."""
        return Capabilities.of_server(per_request_stats=False)

    def path(self, route: Route, *, stream: bool) -> str:
        """``/generate`` or ``/generate_stream`` natively, else the OpenAI chat route."""
        if route != "native":
            return self.chat_path
        return "/generate_stream" if stream else "/generate"

    def build_body(
        self,
        request: GenerationRequest,
        route: Route,
        *,
        stream: bool,
        model: str | None,
        extra_body: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The OpenAI chat body with what TGI's validation needs, or the native body."""
        body = super().build_body(request, route, stream=stream, model=model, extra_body=extra_body)
        if route == "native":
            return body
        if request.response_format is not None and "response_format" not in request.extra:
            grammar = tgi_grammar(request.response_format)
            if grammar is None:
                body.pop("response_format", None)
            else:
                body["response_format"] = grammar
        if request.top_p >= 1.0:
            body.pop("top_p", None)  # TGI refuses top_p = 1.0 (it must be < 1)
        return body

    def native_body(
        self, request: GenerationRequest, *, stream: bool, extra_body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The native ``/generate`` body: ``extra_body`` goes inside ``parameters``."""
        assert request.prompt is not None
        parameters: dict[str, Any] = {"max_new_tokens": request.max_tokens, "details": True}
        if request.temperature > 0:
            parameters["do_sample"] = True
            parameters["temperature"] = request.temperature
            if request.top_p < 1.0:
                parameters["top_p"] = request.top_p
            if request.top_k > 0:
                parameters["top_k"] = request.top_k
        else:
            parameters["do_sample"] = False
        if request.stop:
            parameters["stop"] = list(request.stop)
        if request.seed is not None:
            parameters["seed"] = request.seed
        grammar = tgi_grammar(request.response_format)
        if grammar is not None:
            parameters["grammar"] = grammar
        parameters.update(extra_body)
        parameters.update(request.extra)
        return {"inputs": request.prompt, "parameters": parameters, "stream": stream}

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """Token counts and timings (``x-inference-time`` for non-streamed native answers)."""
        stats = self.timing_stats(summary, note=_NOTE)
        if summary.streamed or context.route != "native":
            return stats
        inference_ms = header_count(summary.headers, "x-inference-time")
        prompt = header_count(summary.headers, "x-prompt-tokens")
        return stats.replace(
            decode_s=inference_ms / 1000.0 if inference_ms is not None else None,
            prompt_tokens=prompt if prompt is not None else stats.prompt_tokens,
            note=_NOTE + "; decode_s is TGI's x-inference-time (includes the prompt pass)",
        )

    def decoder(self, context: RequestContext, options: DecoderOptions) -> StreamDecoder:
        """The native decoder for ``/generate_stream``, else the OpenAI one."""
        if context.route != "native":
            return super().decoder(context, options)
        return _NativeDecoder(**options)

    def parse_answer(self, context: RequestContext, response: JSONResponse) -> ParsedResponse:
        """Native ``generated_text`` + ``details``, else OpenAI parsing."""
        if context.route != "native":
            return super().parse_answer(context, response)
        data = response.data
        text = responses.required_text(
            data,
            "generated_text",
            url=context.url,
            answer="/generate answer",
            server="a TGI server",
        )
        raw_details = data.get("details")
        details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
        generated = count(details.get("generated_tokens"))
        if generated is None:
            generated = header_count(response.headers, "x-generated-tokens")
        prompt = header_count(response.headers, "x-prompt-tokens")
        return ParsedResponse(
            text=text,
            finish_reason=responses.map_finish_reason(details.get("finish_reason")),
            tool_calls=(),
            usage=usage_of(prompt, generated),
            model="",
            extras={"details": details},
            tokens=_tokens_of(details.get("tokens")),
        )


class TGIBackend(OpenAICompatibleBackend, dialect=TGIDialect):
    """A TGI server: chat through its OpenAI route, prompts through native ``/generate``.

    Args:
        base_url: The server URL, e.g. ``http://127.0.0.1:8080``.
        **options: ``HTTPOptions``, the connection options of ``OpenAICompatibleBackend``.
            ``endpoint`` is ``auto`` (chat -> OpenAI route, prompt ->
            ``/generate``), ``chat`` or ``native``; natively ``extra_body`` goes inside
            ``parameters``. ``require_speculation=True`` is refused: TGI reports
            nothing that says whether it speculates.

    Raises:
        ConfigError: An option is invalid.
    """
