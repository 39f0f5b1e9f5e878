"""Speculative where users compare it with LlamaIndex's OpenAI and Ollama (no sockets).

Keyword arguments as the other LLMs take them, ``timeout``/``max_retries`` as fields of
their own, and ``additional_kwargs`` plus unknown call-time arguments for the server.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from langchain_scripted import ScriptedBackend, text_script

from llama_index.llms.speculative import Speculative
from speculative_llm import Backend, ConfigError
from speculative_llm.errors import UnsupportedFeatureError

URL = "http://127.0.0.1:9"
STEPS = [[("ok", "target")]]


def scripted() -> ScriptedBackend:
    return ScriptedBackend(text_script(STEPS, drafted=0))


def transport(llm: Speculative) -> Any:
    return llm.backend._transport  # type: ignore[attr-defined]


def test_timeout_and_max_retries_are_fields_that_reach_the_backend() -> None:
    llm = Speculative(backend="llamacpp", base_url=URL, timeout=7.5, max_retries=4)
    assert (llm.timeout, llm.max_retries) == (7.5, 4)
    assert transport(llm).read_timeout == 7.5 and transport(llm).retry.max_retries == 4
    # They serialise (backend_options do not) and come back.
    again = Speculative.from_dict(llm.to_dict())
    assert (again.timeout, again.max_retries) == (7.5, 4)
    for each in (llm, again):
        each.close()


def test_timeout_in_backend_options_still_works_and_a_conflict_raises() -> None:
    llm = Speculative(backend="llamacpp", base_url=URL, backend_options={"timeout": 9})
    assert transport(llm).read_timeout == 9
    llm.close()
    with pytest.raises(ConfigError, match="given twice") as error:
        Speculative(backend="llamacpp", base_url=URL, timeout=5, backend_options={"timeout": 9})
    assert error.value.field == "timeout"


def test_a_positional_backend_warns_and_works() -> None:
    backend = scripted()
    with pytest.warns(DeprecationWarning, match=r"Speculative\(backend="):
        llm = Speculative(backend)  # type: ignore[misc]
    assert llm.backend is backend
    with pytest.raises(ConfigError, match="keyword arguments only"):
        Speculative(backend, "llamacpp")  # type: ignore[misc]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Speculative(backend=backend)  # the documented form: no warning


def test_additional_kwargs_and_call_fields_reach_the_request_in_order() -> None:
    backend = scripted()
    llm = Speculative(backend=backend, additional_kwargs={"min_p": 0.05, "n_probs": 2})
    llm.complete("hi")
    assert dict(backend.requests[-1].extra) == {"min_p": 0.05, "n_probs": 2}
    llm.complete("hi", min_p=0.1, parallel_tool_calls=False, extra_body={"n_probs": 0})
    assert dict(backend.requests[-1].extra) == {
        "min_p": 0.1,
        "n_probs": 0,
        "parallel_tool_calls": False,
    }
    server = Speculative(backend="llamacpp", base_url=URL, additional_kwargs={"min_p": 0.05})
    again = Speculative.from_dict(server.to_dict())
    assert again.additional_kwargs == {"min_p": 0.05}
    for each in (server, again):
        each.close()


def test_additional_kwargs_naming_an_argument_of_its_own_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"pass max_tokens=\.\.\. directly") as error:
        Speculative(backend=scripted(), additional_kwargs={"max_tokens": 5})
    assert error.value.field == "additional_kwargs"
    with pytest.raises(ConfigError) as not_a_dict:
        Speculative(backend=scripted(), additional_kwargs=[1])  # type: ignore[arg-type]
    assert not_a_dict.value.field == "additional_kwargs"


def test_the_local_engine_refuses_additional_kwargs_it_cannot_honour(
    tiny_backend: Backend,
) -> None:
    with pytest.raises(UnsupportedFeatureError, match=r"'min_p'.*takes only cache_prompt"):
        Speculative(backend=tiny_backend, additional_kwargs={"min_p": 0.05})
    llm = Speculative(backend=tiny_backend, max_tokens=2, additional_kwargs={"cache_prompt": False})
    with pytest.raises(UnsupportedFeatureError, match="'typical_p'"):
        llm.complete("abcabc", typical_p=0.9)
