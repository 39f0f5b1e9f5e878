"""The ``/compare`` API's arguments for gradio_client callers, in the page's own order.

The order comes from ``RunInputs`` (the history state is not part of the API), so a new
input of the page is one default here instead of an edit in every test that calls it.
"""

from __future__ import annotations

from typing import Any

from speculative_playground.handlers import RunInputs

COMPARE_DEFAULTS: dict[str, Any] = {
    "prompt": "Say hello",
    "backend": "local",
    "model": "smollm2-135m",
    "draft_model": "",
    "method": "ngram",
    "k": 4,
    "temperature": 0.0,
    "max_tokens": 40,
    "timing": "auto",
    "runs": 1,
    "server_kind": "llamacpp",
    "server_url": "",
    "baseline_url": "",
    "served_model": "",
    "api_key": "",
    "json_schema": "",
    "seed": 0,
    "exact": "distribution",
}


def compare_arguments(**values: Any) -> list[Any]:
    """Positional arguments of ``/compare``: the defaults above, with ``values`` changed."""
    names = [name for name in RunInputs.names() if name != "history"]
    if set(names) != set(COMPARE_DEFAULTS):
        raise AssertionError(f"COMPARE_DEFAULTS is out of date with RunInputs: {names}")
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"/compare has no input named {sorted(unknown)}; it takes {names}")
    chosen = {**COMPARE_DEFAULTS, **values}
    return [chosen[name] for name in names]
