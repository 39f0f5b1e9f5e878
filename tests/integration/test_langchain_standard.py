"""langchain-tests standard integration suites for ChatSpeculative.

Two real configurations:

* a real llama-server with n-gram speculation serving the packaged SmolLM2-135M-Instruct,
  with tools in ``tool_calling="json_schema"`` mode: SmolLM2's chat template renders no
  tools, and with a template that does (tests/fixtures/chatml_tools.jinja) the 135M
  model still answers in prose instead of calling (see test_langchain_chains.py);
  constrained JSON makes every call well-formed;
* the in-process engine on the same SmolLM2 model (the llama.cpp runner), with tools
  and structured output through grammar-constrained decoding: its own prompt (the tools
  in the system message, since SmolLM2's template renders none) and a grammar that
  admits only a well-formed call or answer.

Skips come from langchain-tests itself and name what is missing (image, audio, PDF
inputs; VCR; serialisation; per-call model override on a one-model server).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_speculative import ChatSpeculative
from speculative_llm import Backend

pytestmark = pytest.mark.integration

JSON_MODE_REASON = (
    "json_mode (response_format json_object) guarantees valid JSON, not the schema's keys: "
    "SmolLM2-135M (135M parameters) nests or drops them; json_schema (the default method) "
    "constrains the keys and passes"
)


def _expected_failure(name: str, reason: str, **options: Any) -> Callable[..., Any]:
    """Re-export the standard test ``name`` marked xfail (its parametrisation is kept)."""
    base = getattr(ChatModelIntegrationTests, name)
    test: Callable[..., Any]
    if inspect.iscoroutinefunction(base):

        @functools.wraps(base)
        async def test(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await base(self, *args, **kwargs)

    else:

        @functools.wraps(base)
        def test(self: Any, *args: Any, **kwargs: Any) -> Any:
            return base(self, *args, **kwargs)

    return pytest.mark.xfail(reason=reason, **options)(test)


class TestChatSpeculativeLlamaServer(ChatModelIntegrationTests):
    """A real llama-server (n-gram speculation, --jinja) through backend='llamacpp'."""

    base_url: ClassVar[str] = ""

    @pytest.fixture(autouse=True)
    def _server(self, llama_server_ngram: Any) -> None:
        type(self).base_url = llama_server_ngram.base_url

    @property
    def chat_model_class(self) -> type[ChatSpeculative]:
        return ChatSpeculative

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            "backend": "llamacpp",
            "base_url": self.base_url,
            "tool_calling": "json_schema",
            "temperature": 0,
            "max_tokens": 64,
            "timeout": 600,
            # The session's server keeps earlier tests' prompts: a reused prefix is
            # scored in other batch shapes, which can move a greedy near-tie.
            "backend_options": {"extra_body": {"cache_prompt": False}},
        }

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        # llama-server serves the one model it was started with.
        return False

    test_json_mode = _expected_failure(
        "test_json_mode", JSON_MODE_REASON, raises=OutputParserException, strict=False
    )
    test_agent_loop = _expected_failure(
        "test_agent_loop",
        "tool_choice auto leaves SmolLM2-135M a near-tie between calling get_weather and "
        "answering: under llama-server's JSON grammar (objects open with a newline and two "
        "spaces) it answers in prose, with the same prompt the in-process engine calls the "
        "tool (TestChatSpeculativeLocalSmolLM2 runs this test and passes)",
        raises=AssertionError,
        strict=False,
    )


@pytest.fixture(scope="class")
def smollm2_standard_backend(smollm2_gguf: Path) -> Iterator[Backend]:
    """One engine on SmolLM2 for the whole standard suite (loading it takes seconds)."""
    from speculative_llm.backends.local import LocalBackend

    backend = LocalBackend(model=str(smollm2_gguf), speculative={"method": "ngram", "k": 5})
    yield backend
    backend.close()


class TestChatSpeculativeLocalSmolLM2(ChatModelIntegrationTests):
    """The in-process engine on SmolLM2-135M-Instruct (prompt lookup, k=5): every test runs."""

    local: ClassVar[Backend | None] = None

    @pytest.fixture(autouse=True)
    def _share(self, smollm2_standard_backend: Backend) -> None:
        type(self).local = smollm2_standard_backend

    @property
    def chat_model_class(self) -> type[ChatSpeculative]:
        return ChatSpeculative

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Short answers: the suite makes ~60 generations on two CPU cores.
        return {"backend": self.local, "temperature": 0, "max_tokens": 64}

    @property
    def supports_json_mode(self) -> bool:
        return True  # so that the test runs and shows the clear error (xfail below)

    @property
    def supports_model_override(self) -> bool:
        # The local backend serves the model it loaded.
        return False

    test_json_mode = _expected_failure(
        "test_json_mode", JSON_MODE_REASON, raises=OutputParserException, strict=False
    )
