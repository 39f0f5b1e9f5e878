"""VLLMBackend against a real vLLM serving ``SpecConfig(method="suffix")``.

vLLM's ``suffix`` method drafts from Arctic Inference's ``SuffixDecodingCache``: a tree
over the request and a global tree over earlier responses. ``.ci/setup-vllm.sh`` builds
arctic-inference (source only on PyPI; its C++ suffix tree compiles on a CPU) into the
vLLM environment. The server is started from our ``SpecConfig`` through ``VLLMServer``,
so the flags of ``servers/command_lines.py`` and the statistics of ``VLLMBackend`` are
what is tested. The server is ``suffix_server`` (tests/integration/conftest.py), skipped,
naming the setup script, where vLLM or arctic-inference is missing.
"""

from __future__ import annotations

import pytest

from speculative_llm.servers import VLLMServer
from speculative_llm.types import GenerationRequest, Message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

K = 8

ANSWER = """def clamp(value, low, high):
    return max(low, min(value, high))
"""

ASK = GenerationRequest(
    messages=(Message(role="user", content=f"Repeat this code exactly:\n{ANSWER}"),),
    max_tokens=48,
    temperature=0.0,
)


def test_the_server_runs_vllms_suffix_method_from_our_config(suffix_server: VLLMServer) -> None:
    command = " ".join(suffix_server.command)
    assert '"method":"suffix"' in command and f'"num_speculative_tokens":{K}' in command
    assert '"suffix_decoding_max_tree_depth":24' in command


def test_a_repeated_request_drafts_from_the_global_tree(suffix_server: VLLMServer) -> None:
    backend = suffix_server.backend()
    first = backend.generate(ASK)
    again = [backend.generate(ASK) for _ in range(2)]
    for completion in (first, *again):
        stats = completion.stats
        assert stats is not None and stats.backend == "vllm" and stats.source == "exact"
        assert stats.num_speculative_tokens == K
        assert completion.usage is not None
        assert stats.generated_tokens == completion.usage.completion_tokens
        assert stats.draft_tokens is not None and stats.accepted_tokens is not None
        assert 0 < stats.accepted_tokens <= stats.draft_tokens
        # Suffix decoding sizes each draft by its match: never past k.
        assert all(count <= stats.draft_steps for count in stats.drafted_per_position)
        assert len(stats.drafted_per_position) <= K
        # Greedy: speculation never changes the text.
        assert completion.text == first.text
    # The first answer went into the global tree: asked again, the whole answer is there
    # to draft from, so more of it is accepted in fewer verify passes.
    last = again[-1].stats
    assert last is not None and first.stats is not None
    assert last.accepted_tokens is not None and first.stats.accepted_tokens is not None
    assert last.accepted_tokens > first.stats.accepted_tokens
    assert last.verify_steps is not None and first.stats.verify_steps is not None
    assert last.verify_steps < first.stats.verify_steps
