"""langchain-tests standard unit suites for ChatSpeculative.

Two configurations: the in-process engine over the tiny random model (no tool calling)
and a server backend built by name (tool calling and structured output; constructing it
opens no socket, which the unit suite forbids anyway).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_speculative import ChatSpeculative
from speculative_llm import Backend


class TestChatSpeculativeLocalUnit(ChatModelUnitTests):
    """The in-process engine over the tiny model: text only, no tools."""

    tiny: ClassVar[Backend | None] = None

    @pytest.fixture(autouse=True)
    def _share_tiny_backend(self, tiny_backend: Backend) -> None:
        # Properties cannot take fixtures: keep the session's backend on the class.
        type(self).tiny = tiny_backend

    @property
    def chat_model_class(self) -> type[ChatSpeculative]:
        return ChatSpeculative

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": self.tiny, "speculative": {"method": "ngram", "k": 3}}

    @property
    def has_tool_calling(self) -> bool:
        # The local engine has no tool calling: bind_tools raises (tested elsewhere).
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"SPECULATIVE_LLM_API_KEY": "sk-from-env"},
            self.chat_model_params,
            {"api_key": "sk-from-env"},
        )


class TestChatSpeculativeServerUnit(ChatModelUnitTests):
    """A server backend built by name: tool calling and structured output."""

    @property
    def chat_model_class(self) -> type[ChatSpeculative]:
        return ChatSpeculative

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Port 9 (discard): nothing is sent, construction opens no connection.
        return {"backend": "openai", "base_url": "http://127.0.0.1:9", "model": "smollm2"}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"SPECULATIVE_LLM_API_KEY": "sk-from-env"},
            self.chat_model_params,
            {"api_key": "sk-from-env"},
        )
