"""What ``LocalBackend`` runs when told nothing, and how its arguments become a default.

The default model and speculative configuration live here, with the rules that turn
the constructor's ``speculative`` and ``draft_model`` arguments into the configuration
used by requests that bring none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speculative_llm.config import SpecConfig, local_methods
from speculative_llm.errors import ConfigError

__all__ = ["DEFAULT_MODEL", "DEFAULT_SPEC", "default_spec"]

DEFAULT_MODEL = "smollm2-135m"
"""The packaged SmolLM2-135M-Instruct: loads with no model hub access."""

DEFAULT_SPEC = SpecConfig()
"""``SpecConfig``'s own defaults: cost-aware prompt lookup, drafts of up to
``DEFAULT_LONGEST_DRAFT`` tokens, only as long as they pay for their verification on
this model and machine (on a CPU an extra verified row costs a good part of a one-token
pass), so free text decodes at the baseline's speed and copied text faster. Every
method a user names gets the same cost-aware policy unless ``cost_aware=False``."""


def default_spec(
    speculative: SpecConfig | Mapping[str, Any] | str | None, draft_model: str | None
) -> SpecConfig:
    """The configuration of requests without one, from ``LocalBackend``'s arguments.

    Nothing given: ``DEFAULT_SPEC``, or its ``draft_model`` twin when a draft model is.
    A ``draft_model`` argument fills in a ``speculative`` mapping that names no draft.
    A named method keeps ``SpecConfig``'s defaults, cost-aware drafting included.

    Raises:
        ConfigError: An invalid configuration, or a method the local engine lacks.
    """
    if speculative is None:
        if draft_model:
            return DEFAULT_SPEC.replace(method="draft_model", draft_model=draft_model)
        return DEFAULT_SPEC
    if isinstance(speculative, str) and speculative == "draft_model" and draft_model:
        return SpecConfig(method="draft_model", draft_model=draft_model)
    if (
        isinstance(speculative, Mapping)
        and draft_model
        and not (speculative.get("draft_model") or speculative.get("draft"))
    ):
        speculative = {**speculative, "draft_model": draft_model}
    config = SpecConfig.from_value(speculative)
    assert config is not None
    if config.method not in local_methods():
        raise ConfigError(
            f"The local engine does not implement method {config.method!r}; use one of "
            f"{', '.join(local_methods())}.",
            field="method",
        )
    return config
