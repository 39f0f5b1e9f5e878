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


def test_constrained_output_and_tool_calls_run_on_llama_cpp_s_grammars_without_xgrammar(
    tiny_gguf: Path,
) -> None:
    """No xgrammar (it needs torch): a llama.cpp model's grammars run on libllama's sampler."""
    require_llama_cpp()
    result = _run_without_torch(
        f"""
        from speculative_llm import GenerationRequest, Message, SpecConfig
        from speculative_llm.backends.local import LocalBackend

        backend = LocalBackend(model={str(tiny_gguf)!r}, threads=1)
        spec = SpecConfig(method="ngram", num_speculative_tokens=3)
        digits = {{"type": "json_schema", "json_schema": {{"name": "n", "schema": {{
            "type": "object", "properties": {{"a": {{"type": "integer"}}}}, "required": ["a"],
        }}}}}}
        constrained = backend.generate(
            GenerationRequest(prompt="abc", max_tokens=40, response_format=digits, spec=spec)
        )
        tools = [{{"type": "function", "function": {{"name": "f", "parameters": {{
            "type": "object", "properties": {{"x": {{"type": "string", "enum": ["ab", "cd"]}}}},
            "required": ["x"],
        }}}}}}]
        called = backend.generate(
            GenerationRequest(
                messages=[Message(role="user", content="abc")],
                max_tokens=60,
                tools=tools,
                tool_choice="required",
            )
        )
        backend.close()
        print(json.dumps({{
            "text": constrained.text,
            "finish": constrained.finish_reason,
            "calls": [[call.name, call.arguments] for call in called.tool_calls or ()],
            "xgrammar_loaded": sys.modules.get("xgrammar") is not None,
        }}))
        """
    )
    assert result["xgrammar_loaded"] is False
    if result["finish"] == "stop":  # the tiny model may run out of tokens inside the number
        parsed = json.loads(str(result["text"]))
        assert set(parsed) == {"a"} and isinstance(parsed["a"], int)
    else:
        assert str(result["text"]).startswith("{")
    calls = result["calls"]
    assert isinstance(calls, list) and len(calls) == 1
    name, arguments = calls[0]
    assert name == "f" and arguments["x"] in ("ab", "cd")


def test_a_transformers_model_s_grammar_without_xgrammar_names_the_grammar_extra(
    tiny_model_dir: Path,
) -> None:
    """Only llama.cpp's models have a grammar sampler of their own."""
    result = _run_without_torch(
        f"""
        sys.modules.pop("torch"), sys.modules.pop("transformers")  # torch is there this time
        from speculative_llm import GenerationRequest
        from speculative_llm.backends.local import LocalBackend
        from speculative_llm.errors import MissingDependencyError

        backend = LocalBackend(model={str(tiny_model_dir)!r}, runner="transformers", threads=1)
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
