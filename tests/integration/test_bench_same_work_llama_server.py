"""llama-server, compared with the local engine in the bench, does the same work.

A scripted agent_loop step offers tools. Sent with ``tool_choice="auto"``, llama-server
renders them with SmolLM2's chat template, which shows none: another prompt, and an
answer in prose. Its forced choice ("required") our backend enforces itself, in the JSON
tool protocol. Rewritten by ``as_the_local_engine_asks``, either has the local engine's
prompt to the token and answers under the local engine's grammar with one tool call.
"""

from __future__ import annotations

import json

import pytest

from speculative_llm import Backend, SpecConfig
from speculative_llm.bench.agent_tasks import AGENT_CATEGORY
from speculative_llm.bench.prompts import builtin_prompts
from speculative_llm.bench.same_work import as_the_local_engine_asks
from speculative_llm.servers import LlamaServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_llama_server_gets_the_local_engines_prompt_and_grammar(
    local: Backend, llama_server_plain: LlamaServer
) -> None:
    step = next(p for p in builtin_prompts([AGENT_CATEGORY]) if p.tools)
    request = step.request(64, SpecConfig(method="none"))
    ours = local.generate(request.replace(extra={"cache_prompt": False}))
    assert ours.tool_calls, ours.text  # the local engine answers with a call
    with llama_server_plain.backend(extra_body={"cache_prompt": False}) as server:
        assert request.tool_choice == "required"
        native = server.generate(request.replace(spec=None, tool_choice="auto"))
        forced = server.generate(request.replace(spec=None))
        same = server.generate(as_the_local_engine_asks(request.replace(spec=None)))
    # Left to choose, llama-server renders SmolLM2's template, which shows no tools.
    assert native.stats.prompt_tokens != ours.stats.prompt_tokens  # what the rewrite fixes
    # A forced choice, which llama-server ignores, our backend sends in the JSON tool
    # protocol itself: the local engine's prompt already.
    assert forced.stats.prompt_tokens == ours.stats.prompt_tokens
    assert same.stats.prompt_tokens == ours.stats.prompt_tokens
    call = json.loads(same.text)
    assert set(call) == {"tool", "arguments"}
    assert call["tool"] in {tool["function"]["name"] for tool in step.tools or ()}
