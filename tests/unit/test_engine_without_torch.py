"""The llama.cpp path needs no torch: the engine imports and generates where torch cannot load.

Each check runs in a child interpreter in which torch, transformers, xgrammar, gguf,
accelerate and triton are made unimportable (``sys.modules[name] = None``) before the
library is imported: what ``pip install speculative-llm[local]`` gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from local_runners import require_llama_cpp

_WITHOUT_TORCH = textwrap.dedent(
    """
    import json, sys
    for name in ("torch", "transformers", "xgrammar", "gguf", "accelerate", "triton"):
        sys.modules[name] = None
    """
)


def _run_without_torch(code: str) -> dict[str, object]:
    """Run ``code`` in a child without torch; it prints one JSON object, returned here."""
    child = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    result: dict[str, object] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def test_the_engine_generates_on_llama_cpp_without_torch(tiny_gguf: Path) -> None:
    require_llama_cpp()
    result = _run_without_torch(
        f"""
        from speculative_llm import GenerationRequest, SpecConfig
        from speculative_llm.backends.local import LocalBackend

        backend = LocalBackend(model={str(tiny_gguf)!r}, threads=1)
        spec = SpecConfig(method="ngram", num_speculative_tokens=3)
        greedy = backend.generate(GenerationRequest(prompt="abcabcab", max_tokens=6, spec=spec))
        sampled = [
            backend.generate(
                GenerationRequest(
                    prompt="abcabcab", max_tokens=6, temperature=1.0, seed=3, spec=spec
                )
            ).text
            for _ in range(2)
        ]
        backend.close()
        print(json.dumps({{
            "greedy_tokens": greedy.stats.generated_tokens,
            "sampled": sampled,
            "torch_loaded": sys.modules.get("torch") is not None,
        }}))
        """
    )
    assert result["greedy_tokens"] == 6
    sampled = result["sampled"]
    assert isinstance(sampled, list) and sampled[0] == sampled[1]  # seeded: reproducible
    assert result["torch_loaded"] is False


def test_asking_for_the_transformers_runner_without_torch_names_its_extra(
    tiny_gguf: Path,
) -> None:
    result = _run_without_torch(
        f"""
        from speculative_llm.backends.local import LocalBackend
        from speculative_llm.errors import MissingDependencyError

        caught = {{}}
        try:
            LocalBackend(model={str(tiny_gguf)!r}, runner="transformers", threads=1)
        except MissingDependencyError as error:
            caught["runner"] = [error.extra, str(error)]
        try:
            from speculative_llm.engine import TransformersRunner  # noqa: F401
        except MissingDependencyError as error:
            caught["import"] = [error.extra, str(error)]
        print(json.dumps(caught))
        """
    )
    for extra, message in result.values():  # type: ignore[misc]
        assert extra == "transformers"
        assert 'pip install "speculative-llm[transformers]"' in message
    assert set(result) == {"runner", "import"}


def test_a_constrained_request_without_xgrammar_names_the_grammar_extra(tiny_gguf: Path) -> None:
    """Structured output needs the grammar extra; plain requests on the same backend do not."""
    require_llama_cpp()
    result = _run_without_torch(
        f"""
        from speculative_llm import GenerationRequest
        from speculative_llm.backends.local import LocalBackend
        from speculative_llm.errors import MissingDependencyError

        backend = LocalBackend(model={str(tiny_gguf)!r}, threads=1)
        caught = []
        try:
            backend.generate(
                GenerationRequest(
                    prompt="abc", max_tokens=4, response_format={{"type": "json_object"}}
                )
            )
        except MissingDependencyError as error:
            caught = [error.extra, str(error)]
        plain = backend.generate(GenerationRequest(prompt="abc", max_tokens=4))
        backend.close()
        print(json.dumps({{"caught": caught, "plain": plain.stats.generated_tokens}}))
        """
    )
    extra, message = result["caught"]  # type: ignore[misc]
    assert extra == "grammar"
    assert 'pip install "speculative-llm[grammar]"' in message
    assert "response_format" in message
    assert result["plain"] == 4
