"""Every server engine is one dialect on the one OpenAI-compatible client.

The checks a server backend makes when it is built live in the client, not in each
engine, so they hold the same way for every server backend of the registry (and for one
added later): a test here is parametrised over ``SERVER_BACKENDS``.
"""

from __future__ import annotations

import re

import pytest

from speculative_llm import ConfigError, build_backend, create_backend
from speculative_llm.backends.registry import SERVER_BACKENDS, backend_factory

URL = "http://127.0.0.1:9"


@pytest.mark.parametrize("value", ["yes", 1, None])
@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_every_server_engine_refuses_a_require_speculation_that_is_not_a_bool(
    name: str, value: object
) -> None:
    message = f"require_speculation must be True or False, got {value!r}."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$") as caught:
        create_backend(name, base_url=URL, require_speculation=value)
    assert caught.value.field == "require_speculation"
    # build_backend (the adapters', the playground's and the CLI's way in) says the same.
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        build_backend(name, base_url=URL, options={"require_speculation": value})


@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_every_server_engine_names_itself_for_an_option_it_does_not_take(name: str) -> None:
    factory = backend_factory(name)
    with pytest.raises(TypeError, match=rf"^{factory.__qualname__}\.__init__\(\) .* 'colour'$"):
        factory(URL, colour="red")
