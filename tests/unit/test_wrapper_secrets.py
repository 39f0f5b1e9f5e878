"""Secrets stay out of every form a wrapper shows; per-call arguments are checked (no sockets).

A LangChain model's ``to_json()`` is what LangChain hands every callback
(``on_chat_model_start``'s ``serialized``), so a tracer would upload whatever it holds;
a LlamaIndex LLM's ``to_dict()`` goes into its instrumentation events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from langchain_scripted import ScriptedBackend, text_script

from speculative_llm import ConfigError
from speculative_llm.backends.http import validate_base_url
from speculative_llm.backends.secret_options import (
    hide_base_url_credentials,
    protect_backend_options,
    reveal_base_url,
)

PASSWORD = "s3cr3tPassW0rd"
BEARER = "Bearer tok-9f8e7d6c5b4a"
HEADER_KEY = "hdrsecret-XYZ987"
API_KEY = "sk-live-abcdef123456"
URL = f"http://admin:{PASSWORD}@127.0.0.1:18110"
OPTIONS = {"headers": {"Authorization": BEARER, "X-Api-Key": HEADER_KEY}}
SECRETS = (PASSWORD, BEARER, "tok-9f8e7d6c5b4a", HEADER_KEY, API_KEY)


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def scripted() -> ScriptedBackend:
    return ScriptedBackend(text_script([[("hi", "target")]], drafted=0))


# ---- LangChain ------------------------------------------------------------------------------


def langchain_forms(model: Any) -> dict[str, str]:
    return {
        "repr": repr(model),
        "str": str(model),
        "model_dump_json": model.model_dump_json(),
        "to_json": json.dumps(model.to_json(), default=str),
        "dict": str(model.model_dump()),
    }


@pytest.mark.parametrize("kind", ["chat", "llm"])
def test_langchain_models_show_no_secret_in_any_form(kind: str) -> None:
    from langchain_speculative import ChatSpeculative, SpeculativeLLM

    cls = ChatSpeculative if kind == "chat" else SpeculativeLLM
    model = cls(backend="llamacpp", base_url=URL, backend_options=OPTIONS)
    keyed = cls(backend="llamacpp", base_url="http://127.0.0.1:18110", api_key=API_KEY)  # type: ignore[arg-type]
    for name, text in {**langchain_forms(model), **langchain_forms(keyed)}.items():
        assert leaked(text) == [], name
    assert model.base_url == "http://127.0.0.1:18110"
    assert keyed.lc_secrets == {"api_key": "SPECULATIVE_LLM_API_KEY"}
    # The secrets still reach the transport: basic auth, the headers, the key.
    transport: Any = model.client.transport  # type: ignore[attr-defined]
    assert transport._auth is not None
    assert transport._request_headers()["X-Api-Key"] == HEADER_KEY
    assert keyed.client.transport._request_headers()["Authorization"] == f"Bearer {API_KEY}"  # type: ignore[attr-defined]
    assert leaked(repr(model.client)) == []


def test_the_callbacks_serialized_argument_holds_no_secret() -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    from langchain_speculative import ChatSpeculative

    seen: list[str] = []

    class Tracer(BaseCallbackHandler):
        def on_chat_model_start(self, serialized: dict[str, Any], *args: Any, **kw: Any) -> None:
            seen.append(json.dumps(serialized, default=str))

    chat = ChatSpeculative(backend=scripted())
    chat.invoke("hi", config={"callbacks": [Tracer()]})
    server = ChatSpeculative(backend="llamacpp", base_url=URL, backend_options=OPTIONS)
    # The serialised form a tracer receives is the model's to_json().
    seen.append(json.dumps(server.to_json(), default=str))
    assert seen and all(leaked(text) == [] for text in seen)


# ---- LlamaIndex -----------------------------------------------------------------------------


def llama_index_forms(llm: Any) -> dict[str, str]:
    return {
        "repr": repr(llm),
        "str": str(llm),
        "model_dump_json": llm.model_dump_json(),
        "to_dict": json.dumps(llm.to_dict(), default=str),
        "to_json": llm.to_json(),
    }


def test_llama_index_llm_shows_no_secret_in_any_form() -> None:
    from llama_index.llms.speculative import Speculative

    llm = Speculative("llamacpp", base_url=URL, api_key=None, backend_options=OPTIONS)
    keyed = Speculative("llamacpp", base_url="http://127.0.0.1:18110", api_key=API_KEY)
    for name, text in {**llama_index_forms(llm), **llama_index_forms(keyed)}.items():
        assert leaked(text) == [], name
    assert keyed.api_key is not None and keyed.api_key.get_secret_value() == API_KEY
    transport: Any = keyed.backend.transport  # type: ignore[attr-defined]
    assert transport._request_headers()["Authorization"] == f"Bearer {API_KEY}"
    assert llm.backend.transport._auth is not None  # type: ignore[attr-defined]
    assert llm.base_url == "http://127.0.0.1:18110"


def test_llama_index_reads_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from llama_index.llms.speculative import Speculative

    monkeypatch.setenv("SPECULATIVE_LLM_API_KEY", API_KEY)
    llm = Speculative("llamacpp", base_url="http://127.0.0.1:18110")
    assert llm.api_key is not None and llm.api_key.get_secret_value() == API_KEY
    assert leaked(repr(llm)) == []
    with pytest.raises(ConfigError, match="api_key must be a string") as caught:
        Speculative("llamacpp", base_url="http://127.0.0.1:18110", api_key=123)  # type: ignore[arg-type]
    assert caught.value.field == "api_key"


# ---- the helpers ----------------------------------------------------------------------------


def test_url_credentials_are_taken_out_and_put_back() -> None:
    clean, credentials = hide_base_url_credentials("http://us%40r:p%3Ass@h:1/v1")
    assert clean == "http://h:1/v1" and credentials is not None
    assert "p:ss" not in repr(credentials) and "p%3Ass" not in repr(credentials)
    assert reveal_base_url(clean, credentials) == "http://us%40r:p%3Ass@h:1/v1"
    assert hide_base_url_credentials("http://h:1") == ("http://h:1", None)
    assert hide_base_url_credentials(None) == (None, None)
    protected = protect_backend_options({"api_key": API_KEY, **OPTIONS, "timeout": 3})
    assert leaked(repr(protected)) == [] and protected["timeout"] == 3


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        (f"admin:{PASSWORD}@127.0.0.1:18112", "must start with http://"),
        ("http://a:b@[::1", "not a valid URL"),
        (f"http://admin:{PASSWORD}@[::1", "not a valid URL"),
    ],
)
def test_bad_urls_with_credentials_give_a_config_error_without_them(
    url: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment) as caught:
        validate_base_url(url)
    assert PASSWORD not in str(caught.value) and ":b@" not in str(caught.value)
    assert caught.value.field == "base_url"


def test_a_wrapper_with_a_bad_url_names_the_field_not_the_password() -> None:
    from langchain_speculative import ChatSpeculative
    from llama_index.llms.speculative import Speculative

    build: list[Callable[[], object]] = [
        lambda: ChatSpeculative(backend="llamacpp", base_url=f"admin:{PASSWORD}@127.0.0.1:1"),
        lambda: Speculative("llamacpp", base_url=f"http://admin:{PASSWORD}@[::1"),
    ]
    for make in build:
        with pytest.raises(ConfigError) as caught:
            make()
        assert PASSWORD not in str(caught.value) and caught.value.field == "base_url"


# ---- per-call arguments ---------------------------------------------------------------------


def test_langchain_per_call_arguments_are_checked() -> None:
    from langchain_speculative import ChatSpeculative, SpeculativeLLM

    for model in (ChatSpeculative(backend=scripted()), SpeculativeLLM(backend=scripted())):
        # An argument the model does not map is a field for the server (as ChatOpenAI).
        model.invoke("hi", foo_bar=1)
        assert dict(model.client.requests[-1].extra) == {"foo_bar": 1}  # type: ignore[attr-defined]
        with pytest.raises(ConfigError, match=r"'temprature'.*Did you mean 'temperature'") as typo:
            model.invoke("hi", temprature=0.5)
        assert typo.value.field == "temprature" and "extra_body" in str(typo.value)
        with pytest.raises(ConfigError, match="stop") as wrong:
            model.invoke("hi", stop=123)  # type: ignore[arg-type]
        assert wrong.value.field == "stop"
        with pytest.raises(ConfigError) as not_a_dict:
            model.invoke("hi", extra_body=[1])
        assert not_a_dict.value.field == "extra_body"
        with pytest.raises(ConfigError) as bad_tools:
            model.invoke("hi", tools=5)
        assert bad_tools.value.field == "tools"


def test_langchain_extra_body_reaches_the_request() -> None:
    from langchain_speculative import ChatSpeculative

    backend = scripted()
    ChatSpeculative(backend=backend).invoke("hi", extra_body={"cache_prompt": False})
    assert dict(backend.requests[-1].extra) == {"cache_prompt": False}


def test_llama_index_per_call_arguments_are_checked() -> None:
    from llama_index.core.llms import ChatMessage

    from llama_index.llms.speculative import Speculative

    backend = scripted()
    llm = Speculative(backend=backend)
    llm.complete("hi", foo_bar=1)  # not a Speculative argument: a field for the server
    assert dict(backend.requests[-1].extra) == {"foo_bar": 1}
    with pytest.raises(ConfigError, match="'max_token'") as typo:
        llm.complete("hi", max_token=5)
    assert typo.value.field == "max_token"
    with pytest.raises(ConfigError) as wrong:
        llm.chat([ChatMessage(role="user", content="hi")], stop=123)
    assert wrong.value.field == "stop"
    llm.complete("hi", extra_body={"cache_prompt": False}, stop="END")
    assert dict(backend.requests[-1].extra) == {"cache_prompt": False}
    assert backend.requests[-1].stop == ("END",)
