"""The LangChain adapters leave a request's checks to the backend: once per call."""

from __future__ import annotations

import asyncio

import pytest
from langchain_scripted import ScriptedBackend, text_script

from langchain_speculative import ChatSpeculative, SpeculativeLLM
from speculative_llm import GenerationRequest, UnsupportedMethodError


class CheckCountingBackend(ScriptedBackend):
    """A scripted backend (its ``stream`` checks each request) that counts the checks."""

    def __init__(self) -> None:
        super().__init__(text_script([[("ok", "target")]], drafted=0))
        self.checks = 0

    def check_request(self, request: GenerationRequest) -> None:
        self.checks += 1
        super().check_request(request)


async def _drain_chat(chat: ChatSpeculative) -> None:
    await chat.ainvoke("hi")
    async for _ in chat.astream("hi"):
        pass


async def _drain_llm(llm: SpeculativeLLM) -> None:
    await llm.ainvoke("hi")
    async for _ in llm.astream("hi"):
        pass


def test_each_chat_call_checks_its_request_once() -> None:
    backend = CheckCountingBackend()
    chat = ChatSpeculative(backend=backend)
    assert chat.invoke("hi").content == "ok"
    assert backend.checks == 1
    assert "".join(str(chunk.content) for chunk in chat.stream("hi")) == "ok"
    assert backend.checks == 2
    asyncio.run(_drain_chat(chat))
    assert backend.checks == 4


def test_each_llm_call_checks_its_request_once() -> None:
    backend = CheckCountingBackend()
    llm = SpeculativeLLM(backend=backend)
    assert llm.invoke("hi") == "ok"
    assert backend.checks == 1
    assert "".join(llm.stream("hi")) == "ok"
    assert backend.checks == 2
    asyncio.run(_drain_llm(llm))
    assert backend.checks == 4


def test_a_request_the_backend_refuses_still_fails_the_call() -> None:
    chat = ChatSpeculative(backend=CheckCountingBackend())
    with pytest.raises(UnsupportedMethodError, match="does not support speculative method"):
        chat.invoke("hi", speculative="suffix")
    llm = SpeculativeLLM(backend=CheckCountingBackend())
    with pytest.raises(UnsupportedMethodError, match="does not support speculative method"):
        list(llm.stream("hi", speculative="suffix"))
