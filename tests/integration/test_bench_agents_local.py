"""One agent_loop session of the bench through the packaged SmolLM2-135M (local engine, suffix).

What the model chooses to call or say is its own; the test checks that the session ran
through the real agent and that its tally and statistics add up.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("xgrammar", reason="tool calls on the local engine need xgrammar ('local')")

from speculative_llm import Backend
from speculative_llm.bench.agent_tasks import agent_prompts
from speculative_llm.bench.agents import AgentContender
from speculative_llm.bench.contenders import BackendContender
from speculative_llm.bench.records import OURS, Variant
from speculative_llm.config import SpecConfig

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("framework", ["langchain", "llama_index"])
def test_one_agent_session_on_the_packaged_model(local: Backend, framework: str) -> None:
    module = "langchain.agents" if framework == "langchain" else "llama_index.core.agent.workflow"
    pytest.importorskip(module, reason=f"needs {module}")
    prompt = agent_prompts((framework,), 1)[0]
    loop = asyncio.new_event_loop()
    try:
        contender = AgentContender(
            BackendContender(
                Variant(OURS, "suffix", 5),
                local,
                SpecConfig(method="suffix", num_speculative_tokens=5),
            ),
            [framework],
            loop=loop,
            max_tokens=48,
        )
        outcome = contender.run(prompt, 48)
    finally:
        loop.close()
    tally = outcome.agent
    assert tally is not None and tally.framework == framework
    assert tally.model_calls >= 1 and tally.tool_calls <= tally.model_calls
    assert tally.answered == (tally.error is None and bool(outcome.text.strip()))
    assert outcome.stats is not None and outcome.stats.method == "suffix"
    assert outcome.generated_tokens == outcome.stats.generated_tokens > 0
    assert outcome.stats.draft_tokens is not None
