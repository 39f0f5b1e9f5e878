"""A long prompt's progress reports reach no LangChain or LlamaIndex consumer.

The same scripted answer, streamed with and without ``prompt_progress`` chunks before
it, must give the same message chunks, token callbacks and responses: a report is no
text, no token and no statistics.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="the LangChain adapter needs langchain-core")
pytest.importorskip("llama_index.core", reason="the LlamaIndex adapter needs llama-index-core")

from langchain_core.callbacks import BaseCallbackHandler
from langchain_scripted import ScriptedBackend, text_script
from llama_index.core.base.llms.types import ChatMessage

from langchain_speculative import ChatSpeculative, SpeculativeLLM
from llama_index.llms.speculative import Speculative
from speculative_llm.types import Chunk, PromptProgress

STEPS = [[("a", "target")], [("b", "draft"), ("c", "target")]]
REPORTS = [
    Chunk(prompt_progress=PromptProgress(done, 4349, elapsed_s=done / 144))
    for done in (1024, 2048, 3072)
]


def _backends() -> tuple[ScriptedBackend, ScriptedBackend]:
    script = text_script(STEPS, drafted=1)
    return ScriptedBackend(script), ScriptedBackend([*REPORTS, *script])


class _Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


def _chat_stream(backend: ScriptedBackend) -> tuple[list[Any], list[str]]:
    tokens = _Tokens()
    chunks = list(ChatSpeculative(backend=backend).stream("hi", config={"callbacks": [tokens]}))
    return [(c.content, c.response_metadata) for c in chunks], tokens.tokens


def _llm_stream(backend: ScriptedBackend) -> tuple[list[str], list[str]]:
    tokens = _Tokens()
    texts = list(SpeculativeLLM(backend=backend).stream("hi", config={"callbacks": [tokens]}))
    return texts, tokens.tokens


def test_langchain_streams_leave_the_reports_out() -> None:
    plain, reported = _backends()
    assert _chat_stream(reported) == _chat_stream(plain)
    assert _llm_stream(reported) == _llm_stream(plain)
    plain, reported = _backends()
    assert ChatSpeculative(backend=reported).invoke("hi").content == "abc"


async def test_langchain_async_streams_leave_the_reports_out() -> None:
    plain, reported = _backends()
    chat = [c.content async for c in ChatSpeculative(backend=reported).astream("hi")]
    assert chat == [c.content async for c in ChatSpeculative(backend=plain).astream("hi")]


def _responses(backend: ScriptedBackend) -> list[tuple[str, str | None]]:
    llm = Speculative(backend)
    chat = llm.stream_chat([ChatMessage(role="user", content="hi")])
    return [(response.message.content or "", response.delta) for response in chat]


def test_llamaindex_streams_leave_the_reports_out() -> None:
    plain, reported = _backends()
    assert _responses(reported) == _responses(plain)
    assert _responses(reported)[-1][0] == "abc"
