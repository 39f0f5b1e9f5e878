"""transformers' own generation as a peer: greedy, prompt lookup and assisted generation.

``--compare-transformers`` runs ``model.generate`` on the very model object (same
weights, same dtype) and the very prompt token ids the local engine uses, so the
columns differ only by the decoding loop:

* ``none``: ``generate(do_sample=False)``;
* ``ngram``: ``prompt_lookup_num_tokens=k`` with ``max_matching_ngram_size`` set to our
  ``ngram_max`` (3; transformers' default is 2);
* ``draft_model``: ``assistant_model=`` with ``num_assistant_tokens=k``, a constant
  schedule and ``assistant_confidence_threshold=0`` (always draft k tokens, as ours).

transformers has no grammar-constrained generation: on ``structured`` prompts it answers
unconstrained (compare it with our ``structured_free`` rows). transformers reports no
acceptance figures, so these variants have no ``SpecStats``;
their decode time is measured with a streamer that notes when the first new token
arrives (its first ``put`` is the prompt).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from speculative_llm.bench.outcomes import Outcome
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import Variant
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

__all__ = ["FirstTokenClock", "TransformersContender"]


@dataclass(slots=True)
class FirstTokenClock:
    """A transformers streamer that only notes when the first generated token arrives.

    ``generate`` calls ``put`` with the prompt first, then with each step's new tokens.
    """

    puts: int = 0
    first_token_at: float | None = None
    tokens: int = 0

    def put(self, value: Any) -> None:
        """Called by ``generate`` with the prompt, then with new tokens."""
        self.puts += 1
        if self.puts == 1:
            return
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.tokens += int(value.numel())

    def end(self) -> None:
        """Called by ``generate`` when it finishes."""


class TransformersContender:
    """Runs one transformers ``generate`` configuration on the local engine's model.

    Args:
        variant: The peer variant (engine ``transformers``; method ``none``, ``ngram``
            or ``draft_model``; k).
        holder: The ``LocalBackend`` (on the transformers runner) whose model, tokenizer
            and prompt encoding are used.
        assistant_model: The draft model object, for ``draft_model``.
        ngram_max: Longest n-gram prompt lookup matches (ours: ``SpecConfig.ngram_max``).

    Raises:
        ConfigError: ``draft_model`` without an assistant model, or an unknown method.
    """

    def __init__(
        self,
        variant: Variant,
        holder: LocalBackend,
        *,
        assistant_model: Any = None,
        ngram_max: int = SpecConfig().ngram_max,
    ) -> None:
        if holder.runner_name != "transformers":
            raise ConfigError(
                "transformers' generate needs the model loaded by the transformers runner; "
                f"this backend runs on {holder.runner_name}.",
                field="runner",
            )
        if variant.method not in ("none", "ngram", "draft_model"):
            raise ConfigError(
                f"transformers has no equivalent of method {variant.method!r}.", field="methods"
            )
        if variant.method == "draft_model" and assistant_model is None:
            raise ConfigError(
                "transformers' assisted generation needs the draft model (--draft).",
                field="draft_model",
            )
        self.variant = variant
        self._holder = holder
        self._assistant = assistant_model
        self._ngram_max = ngram_max
        # The local engine stops at the same set, so both loops end at the same token.
        self._eos = sorted(holder.tokenizer.eos_token_ids)
        self._tokenizer: Any = getattr(holder.tokenizer, "hf_tokenizer", None)

    def generate_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        """The ``generate`` keyword arguments of this variant (streamer excluded)."""
        pad = self._tokenizer.pad_token_id
        pad = pad if pad is not None else self._eos[0]
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "do_sample": False,
            "eos_token_id": self._eos,
            "pad_token_id": pad,
        }
        if self.variant.method == "ngram":
            kwargs["prompt_lookup_num_tokens"] = self.variant.k
            kwargs["max_matching_ngram_size"] = self._ngram_max
        elif self.variant.method == "draft_model":
            kwargs["assistant_model"] = self._assistant
            kwargs["num_assistant_tokens"] = self.variant.k
            kwargs["num_assistant_tokens_schedule"] = "constant"
            kwargs["assistant_confidence_threshold"] = 0.0
        return kwargs

    def run(self, prompt: BenchPrompt, max_tokens: int) -> Outcome:
        """Generate greedily for one prompt."""
        import torch

        request = prompt.request(max_tokens, None)
        prompt_ids = self._holder.encode_prompt(request)
        model = self._holder.model
        input_ids = torch.tensor([prompt_ids], device=model.device)
        clock = FirstTokenClock()
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                streamer=clock,
                **self.generate_kwargs(request.max_tokens),
            )
        finished = time.perf_counter()
        new_ids = tuple(int(t) for t in output[0, len(prompt_ids) :].tolist())
        text = self._holder.tokenizer.decode(new_ids)
        decode_s = None if clock.first_token_at is None else finished - clock.first_token_at
        return Outcome(
            text=text,
            token_ids=new_ids,
            generated_tokens=len(new_ids),
            decode_s=decode_s,
            stats=None,
        )

    def close(self) -> None:
        """Nothing to free: the model belongs to the holder."""
