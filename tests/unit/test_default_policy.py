"""One drafting default everywhere: cost-aware, whatever method a user names.

``SpecConfig``'s own defaults are the policy; ``generate``, ``bench``, the playground,
``LocalBackend`` and the wrappers take it from there, and the engine's session is built
cost-aware from it. Fixed drafts only when asked (``cost_aware=False``); servers, which
draft a fixed length, get ``DEFAULT_FIXED_DRAFT``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from speculative_llm import SpecConfig
from speculative_llm.bench.contenders import spec_for
from speculative_llm.cli import build_parser
from speculative_llm.commands.bench import options_from_args
from speculative_llm.commands.generate import build_spec
from speculative_llm.config import DEFAULT_FIXED_DRAFT, DEFAULT_LONGEST_DRAFT
from speculative_llm.engine.defaults import DEFAULT_SPEC, default_spec
from speculative_llm.errors import ConfigError
from speculative_llm.servers import vllm_speculative_config

NAMED_METHODS = [
    ("ngram", None),
    ("suffix", None),
    ("draft_model", "smollm2-135m"),
]


def _cost_aware_default(spec: SpecConfig | None) -> None:
    assert spec is not None
    assert spec.is_cost_aware
    assert spec.draft_length == DEFAULT_LONGEST_DRAFT


def test_the_config_defaults_are_the_policy() -> None:
    config = SpecConfig()
    assert config.method == "ngram" and config.num_speculative_tokens is None
    _cost_aware_default(config)
    assert config.fixed_draft_length == DEFAULT_FIXED_DRAFT
    assert config == DEFAULT_SPEC


@pytest.mark.parametrize(("method", "draft"), NAMED_METHODS)
def test_every_named_method_drafts_cost_aware(method: str, draft: str | None) -> None:
    options: dict[str, Any] = {"method": method}
    if draft:
        options["draft_model"] = draft
    _cost_aware_default(SpecConfig.from_value(options))
    # A k the user gives is the longest draft, still cost-aware.
    chosen = SpecConfig.from_value({**options, "num_speculative_tokens": 5})
    assert chosen is not None and chosen.is_cost_aware and chosen.draft_length == 5
    if draft is None:
        _cost_aware_default(SpecConfig.from_value(method))


def test_fixed_drafts_only_when_asked() -> None:
    fixed = SpecConfig(cost_aware=False)
    assert not fixed.is_cost_aware and fixed.draft_length == DEFAULT_FIXED_DRAFT
    assert SpecConfig(cost_aware=False, num_speculative_tokens=3).draft_length == 3
    adaptive = SpecConfig(adaptive=True)
    assert adaptive.adaptive and not adaptive.is_cost_aware
    assert adaptive.draft_length == DEFAULT_FIXED_DRAFT
    # A default config can still be made adaptive: the default yields to it.
    assert not SpecConfig().replace(adaptive=True).is_cost_aware
    with pytest.raises(ConfigError, match="both choose the draft length"):
        SpecConfig(adaptive=True, cost_aware=True)


@pytest.mark.parametrize("value", ["yes", 1])
def test_cost_aware_is_a_boolean_or_none(value: object) -> None:
    with pytest.raises(ConfigError, match="cost_aware must be True, False or None"):
        SpecConfig(cost_aware=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "draft"), NAMED_METHODS)
def test_local_backend_arguments_keep_the_policy(method: str, draft: str | None) -> None:
    _cost_aware_default(default_spec(method, draft))
    _cost_aware_default(default_spec({"method": method}, draft))
    assert not default_spec({"method": method, "cost_aware": False}, draft).is_cost_aware


@pytest.mark.parametrize(("method", "draft"), NAMED_METHODS)
def test_generate_takes_the_policy_for_every_method(method: str, draft: str | None) -> None:
    argv = ["generate", "--method", method, *(["--draft", draft] if draft else []), "hi"]
    _cost_aware_default(build_spec(build_parser().parse_args(argv)))
    fixed = build_spec(build_parser().parse_args(["generate", "--no-cost-aware", "hi"]))
    assert not fixed.is_cost_aware and fixed.draft_length == DEFAULT_FIXED_DRAFT


def test_bench_takes_the_policy() -> None:
    options = options_from_args(build_parser().parse_args(["bench", "--methods", "none,suffix"]))
    assert options.cost_aware and options.ks == (DEFAULT_LONGEST_DRAFT,)
    for variant in options.variants():
        spec = spec_for(variant, None, cost_aware=options.cost_aware)
        if variant.method != "none":
            _cost_aware_default(spec)
    fixed = options_from_args(build_parser().parse_args(["bench", "--no-cost-aware"]))
    assert not fixed.cost_aware and fixed.ks == (DEFAULT_FIXED_DRAFT,)


def test_the_playground_takes_the_policy() -> None:
    from speculative_llm.commands import playground as command
    from speculative_playground.settings import RunSettings

    _cost_aware_default(RunSettings().spec_config())
    local = command._settings(build_parser().parse_args(["playground", "--method", "suffix"]))
    _cost_aware_default(local.spec_config())
    # A managed llama-server drafts a fixed length: it gets the fixed default.
    managed_args = build_parser().parse_args(["playground", "--backend", "llama-server"])
    managed = command._settings(managed_args)
    assert managed.k == DEFAULT_FIXED_DRAFT


def test_servers_draft_a_fixed_length() -> None:
    command = vllm_speculative_config("ngram")
    assert command is not None and command["num_speculative_tokens"] == DEFAULT_FIXED_DRAFT
    chosen = vllm_speculative_config({"method": "ngram", "k": 7})
    assert chosen is not None and chosen["num_speculative_tokens"] == 7


def test_the_engine_session_is_built_cost_aware() -> None:
    pytest.importorskip("torch", reason="the local engine's loop needs torch (the 'local' extra)")
    from counting_runner import CountingRunner
    from speculative_llm.engine.loop.chunks import TargetContext, open_session
    from speculative_llm.engine.loop.draft_cost import VerifyCost
    from speculative_llm.engine.loop.sampling import SamplingParams
    from speculative_llm.engine.request.preparation import PreparedRequest
    from speculative_llm.types import GenerationRequest

    target = SimpleNamespace(tokenizer=SimpleNamespace(eos_token_ids=()), cpu_threads=1)
    context = TargetContext(
        backend="local",
        target=target,  # type: ignore[arg-type]
        runner=CountingRunner(16),  # type: ignore[arg-type]
        verify_cost=VerifyCost(),
    )

    def session_for(spec: SpecConfig) -> Any:
        job = PreparedRequest(
            request=GenerationRequest(prompt="x", spec=spec),
            spec=spec,
            prompt_tokens=[1, 2, 3],
            drafter=None,
            params=SamplingParams(0.0, 1.0, 0),
        )
        return open_session(context, job, 0.0)

    default = session_for(SpecConfig(method="suffix"))
    assert default.draft_length.cost_aware and default.draft_length.k == DEFAULT_LONGEST_DRAFT
    fixed = session_for(SpecConfig(method="suffix", cost_aware=False))
    assert not fixed.draft_length.cost_aware and fixed.draft_length.k == DEFAULT_FIXED_DRAFT
