"""What each HTTP backend says it can do: the flags the wrappers and the playground read."""

from __future__ import annotations

from typing import Any

import pytest

from speculative_llm.backends.base import Capabilities
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend

URL = "http://127.0.0.1:9"

# (backend, options) -> (methods, per_request_stats, live_stats, token_provenance, toggle)
EXPECTED: list[tuple[type[Any], dict[str, Any], tuple[frozenset[str], bool, bool, bool, bool]]] = [
    (LlamaCppBackend, {}, (frozenset({"server"}), True, True, True, False)),
    (LlamaCppBackend, {"live_stats": False}, (frozenset({"server"}), True, False, False, False)),
    (
        LMStudioBackend,
        {},
        (frozenset({"none", "draft_model", "server"}), True, False, False, True),
    ),
    (OpenAICompatibleBackend, {}, (frozenset({"server"}), False, False, False, False)),
    (SGLangBackend, {}, (frozenset({"server"}), True, False, False, False)),
    (TGIBackend, {}, (frozenset({"server"}), False, False, False, False)),
    (VLLMBackend, {"stats": "per_request"}, (frozenset({"server"}), True, False, False, False)),
    (VLLMBackend, {"stats": "counters"}, (frozenset({"server"}), False, False, False, False)),
]


@pytest.mark.parametrize(
    ("backend_class", "options", "expected"),
    EXPECTED,
    ids=[f"{cls.__name__}-{options}" for cls, options, _ in EXPECTED],
)
def test_http_backends_declare_their_capabilities(
    backend_class: type[Any], options: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    with backend_class(URL, **options) as backend:
        capabilities = backend.capabilities
    assert (
        capabilities.methods,
        capabilities.per_request_stats,
        capabilities.live_stats,
        capabilities.token_provenance,
        capabilities.per_request_toggle,
    ) == expected
    # Every HTTP backend maps tools and honours response_format.
    assert capabilities.tool_calling and capabilities.structured_output


def test_server_capabilities_default_to_a_server_that_speculates_as_started() -> None:
    assert Capabilities.of_server(per_request_stats=False) == Capabilities(
        methods=frozenset({"server"}),
        per_request_stats=False,
        live_stats=False,
        token_provenance=False,
        per_request_toggle=False,
        tool_calling=True,
        tool_call_streaming=True,
        structured_output=True,
    )
