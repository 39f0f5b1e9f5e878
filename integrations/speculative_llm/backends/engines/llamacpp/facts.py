"""What llama-server says: its speculation facts (``/slots``) and its ``timings`` (pure).

Field names and their meaning are those of the server source cited in the package's
docstring (``speculative_llm.backends.engines.llamacpp``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from speculative_llm.backends.fields import count, seconds_from_ms
from speculative_llm.backends.http import EngineHints
from speculative_llm.stats import SpecStats

__all__ = [
    "HINTS",
    "NO_SPECULATION_MIN_TOKENS",
    "LlamaServerInfo",
    "llamacpp_stats",
    "method_of_spec_types",
    "parse_slots",
    "parse_spec_types",
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
        # Prompt tokens its prompt cache held (cache_prompt); the rest were prompt_n.
        cached_prompt_tokens=count(timings.get("cache_n")),
        generated_tokens=generated,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_steps=verify_steps,
        ttft_s=ttft_s,
        decode_s=seconds_from_ms(timings.get("predicted_ms")),
        total_s=total_s,
        note="; ".join(notes),
    )
