"""The llama.cpp runner on tiny GGUF files: cache crops, exactness probe, layout, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the local engine needs torch (extra 'local')")
pytest.importorskip("gguf", reason="writing tiny GGUF files needs the gguf package (extra 'local')")

from local_runners import plain_greedy, require_llama_cpp  # noqa: E402
from speculative_llm import (  # noqa: E402
    ConfigError,
    GenerationRequest,
    ModelNotFoundError,
    SpecConfig,
)
from speculative_llm.backends.local import LocalBackend, llama_cpp_model  # noqa: E402
from speculative_llm.backends.local.llama_cpp_model import LlamaCppModel  # noqa: E402
from speculative_llm.backends.local.llama_cpp_runner import exact_verify_rows  # noqa: E402
from speculative_llm.backends.local.model_sources import resolve_model  # noqa: E402
from speculative_llm.backends.local.models import choose_runner  # noqa: E402
from tiny_models import (  # noqa: E402  # noqa: E402
    DECODE_PROMPT,
    load_float32,
    logits_along_a_decode,
    tiny_vocabulary,
    write_gguf,
)


@pytest.fixture(autouse=True)
def _llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_llama_cpp()
    # Each test probes afresh: the probe cache lives with the model cache.
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Any:
    require_llama_cpp()
    loaded = LlamaCppModel(tiny_gguf, threads=1)
    yield loaded
    loaded.close()


def test_logits_follow_the_cache_through_crops(model: Any) -> None:
    """A decode with verify passes and crops gives the logits of one-token decoding."""
    first, second = model.new_runner(), model.new_runner()
    seen = logits_along_a_decode(first)
    assert [tuple(rows.shape) for rows in seen[:2]] == [
        (1, model.vocab_size),
        (4, model.vocab_size),
    ]
    # Same again on a fresh context: cropping left nothing behind.
    again = logits_along_a_decode(second)
    assert all(torch.equal(a, b) for a, b in zip(seen, again, strict=True))
    # The verify pass's rows equal decoding the same tokens one at a time.
    first.reset()
    first.forward(DECODE_PROMPT, 1)
    singles = [first.forward([token], 1)[0].clone() for token in (5, 6, 7, 8)]
    assert all(torch.equal(row, single) for row, single in zip(seen[1], singles, strict=True))
    first.close()
    second.close()


def test_the_probe_finds_exact_rows_and_the_engine_respects_them(model: Any) -> None:
    assert model.exact_rows >= 5  # float16 weights: exact for passes of a few rows
    runner = model.new_runner()
    assert runner.max_verify_tokens == model.exact_rows
    assert exact_verify_rows(runner, [1, *range(10, 40)], 4) == 4
    with pytest.raises(ValueError, match="prompt before"):
        exact_verify_rows(runner, [1, 2, 3], 4)
    runner.close()


def test_a_float32_gguf_verifies_one_token_per_pass(tiny_model_dir: Path, tmp_path: Path) -> None:
    """llama.cpp's batched float32 kernels sum differently: no pass is exact, so no drafts."""
    path = write_gguf(
        tmp_path / "f32.gguf", load_float32(tiny_model_dir), tiny_vocabulary(), quantization="F32"
    )
    with LocalBackend(str(path), runner="llamacpp", threads=1) as backend:
        assert backend.model.exact_rows == 1
        request = GenerationRequest(prompt="def add(a, b):\n", max_tokens=20)
        baseline = backend.generate(request.replace(spec=SpecConfig.baseline()))
        speculative = backend.generate(
            request.replace(spec=SpecConfig(method="ngram", num_speculative_tokens=4))
        )
        assert speculative.text == baseline.text
        assert speculative.stats.draft_tokens == 0
        assert speculative.stats.verify_steps == speculative.stats.generated_tokens


def test_the_probe_result_is_cached_per_file(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = llama_cpp_model.exact_verify_rows

    def counting(runner: Any, probe: Any, rows: int) -> int:
        calls.append(rows)
        return real(runner, probe, rows)

    monkeypatch.setattr(llama_cpp_model, "exact_verify_rows", counting)
    first = LlamaCppModel(tiny_gguf, threads=1)
    probes = len(calls)
    assert probes >= 1
    cached = json.loads(llama_cpp_model._probe_cache_path().read_text())
    # One cache entry per configuration measured, each from every probe context.
    assert first.exact_rows in cached.values()
    assert len(cached) * len(first._probe_tokens(llama_cpp_model.PROBE_ROWS)) == probes
    second = LlamaCppModel(tiny_gguf, threads=1)
    assert len(calls) == probes and second.exact_rows == first.exact_rows  # from the cache
    third = LlamaCppModel(tiny_gguf, threads=1, context_window=64)  # another context: probed
    assert len(calls) > probes
    for loaded in (first, second, third):
        loaded.close()


@pytest.mark.parametrize(
    ("rows_by_one_token_threads", "one_token_threads", "exact"),
    [({2: 17, 1: 17}, 2, 17), ({2: 1, 1: 17}, 1, 17), ({2: 3, 1: 2}, 2, 3)],
)
def test_one_token_passes_take_one_thread_only_where_that_alone_is_exact(
    tiny_gguf: Path,
    monkeypatch: pytest.MonkeyPatch,
    rows_by_one_token_threads: dict[int, int],
    one_token_threads: int,
    exact: int,
) -> None:
    """llama.cpp's multi-thread one-token kernel (split-KV) rounds unlike its batches."""

    def probe(self: Any, repacked: bool, rows: int) -> int:
        return min(rows, rows_by_one_token_threads[self.one_token_threads])

    monkeypatch.setattr(LlamaCppModel, "_measure", probe)
    loaded = LlamaCppModel(tiny_gguf, threads=2, weight_layout="repacked", probe_rows=17)
    expected_rows = min(exact, loaded.context_window // 2)
    assert (loaded.one_token_threads, loaded.exact_rows) == (one_token_threads, expected_rows)
    runner = loaded.new_runner()
    assert runner.one_token_threads == one_token_threads  # what llama.cpp's n_threads gets
    assert ("1 for one-token passes" in loaded.describe()) == (one_token_threads == 1)
    runner.close()
    loaded.close()


def test_the_probe_reaches_past_the_split_kv_threshold(tiny_gguf: Path) -> None:
    loaded = LlamaCppModel(tiny_gguf, threads=1, context_window=1024)
    lengths = [len(probe) for probe in loaded._probe_tokens(17)]
    assert lengths == [48, llama_cpp_model.LONG_PROBE_CONTEXT + 17]
    assert llama_cpp_model.LONG_PROBE_CONTEXT > 512
    small = LlamaCppModel(tiny_gguf, threads=1, context_window=64)
    assert [len(probe) for probe in small._probe_tokens(17)] == [48]  # what fits
    loaded.close()
    small.close()


@pytest.mark.parametrize(
    ("repacked_rows", "plain_rows", "layout", "exact"),
    [(3, 6, "plain", 6), (6, 6, "repacked", 6), (2, 1, "repacked", 2)],
)
def test_auto_layout_keeps_the_layout_with_more_exact_rows(
    tiny_gguf: Path,
    monkeypatch: pytest.MonkeyPatch,
    repacked_rows: int,
    plain_rows: int,
    layout: str,
    exact: int,
) -> None:
    def probe(self: Any, repacked: bool, rows: int) -> int:
        return repacked_rows if repacked else plain_rows

    monkeypatch.setattr(LlamaCppModel, "_measure", probe)
    loaded = LlamaCppModel(tiny_gguf, threads=1)
    assert (loaded.layout, loaded.exact_rows) == (layout, exact)
    assert f"{layout} weights" in loaded.describe()
    runner = loaded.new_runner()  # the kept layout's weights decode
    runner.reset()
    assert runner.forward([1, 20, 30], 1).shape == (1, loaded.vocab_size)
    runner.close()
    loaded.close()


def test_the_tokenizer_round_trips_and_renders_the_chat_template(model: Any) -> None:
    tokenizer = model.tokenizer
    ids = tokenizer.encode("def f(x):\n    return x")
    assert ids[0] == 1  # BOS
    assert tokenizer.decode(ids) == "def f(x):\n    return x"
    assert 2 in tokenizer.eos_token_ids
    prompt = tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert prompt == "<s><user>hi\n<assistant>"
    assert tokenizer.encode(prompt, add_special_tokens=False)[0] == 1  # "<s>" parsed as BOS
    assert len(tokenizer.vocabulary()) == model.vocab_size


def test_draft_model_on_llama_cpp_is_exact(tiny_gguf: Path, tiny_draft_gguf: Path) -> None:
    with LocalBackend(str(tiny_gguf), draft_model=str(tiny_draft_gguf), threads=1) as backend:
        prompt = "def add(a, b):\n    return a + b\n"
        request = GenerationRequest(prompt=prompt, max_tokens=30)
        completion = backend.generate(request)
        reference = plain_greedy(
            backend.model.new_runner(), backend.encode_prompt(request), 30, backend._eos_token_ids
        )
        assert [token.id for token in completion.tokens] == reference
        assert completion.stats.method == "draft_model" and completion.stats.accepted_tokens


# ---- bad input ---------------------------------------------------------------------------


def test_an_architecture_llama_cpp_cannot_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "odd.gguf",
        load_float32(tiny_model_dir),
        tiny_vocabulary(),
        architecture="not-a-real-architecture",
    )
    with pytest.raises(ModelNotFoundError) as caught:
        LocalBackend(str(path), runner="llamacpp")
    message = str(caught.value)
    assert str(path) in message and "runner='transformers'" in message
    assert "not-a-real-architecture" in message  # llama.cpp's own reason


def test_llamacpp_runner_refuses_a_checkpoint_directory(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="runner='transformers'") as caught:
        LocalBackend(str(tiny_model_dir), runner="llamacpp")
    assert caught.value.field == "runner"
    with pytest.raises(ConfigError, match="Unknown runner 'cuda'"):
        choose_runner("cuda", resolve_model(str(tiny_model_dir)), "cpu")


def test_auto_runs_gguf_on_llama_cpp_and_directories_on_transformers(
    tiny_gguf: Path, tiny_model_dir: Path
) -> None:
    assert choose_runner("auto", resolve_model(str(tiny_gguf)), "cpu") == "llamacpp"
    assert choose_runner("auto", resolve_model(str(tiny_gguf)), "cuda") == "transformers"
    assert choose_runner("auto", resolve_model(str(tiny_model_dir)), "cpu") == "transformers"


def test_a_prompt_longer_than_the_context(tiny_gguf: Path) -> None:
    with LocalBackend(str(tiny_gguf), threads=1, context_window=32) as backend:
        with pytest.raises(ConfigError, match="context window of 32") as caught:
            backend.generate(GenerationRequest(prompt="x" * 40, max_tokens=4))
        assert caught.value.field == "prompt"
        # The budget is cut to the room left, and the backend keeps working.
        completion = backend.generate(GenerationRequest(prompt="x" * 20, max_tokens=50))
        assert completion.stats.generated_tokens <= 32 - 21
        assert completion.finish_reason in ("length", "stop")


def test_a_lone_surrogate_is_a_config_error(model: Any) -> None:
    with pytest.raises(ConfigError, match="position 3") as caught:
        model.tokenizer.encode("abc\ud800")
    assert caught.value.field == "prompt"


@pytest.mark.parametrize(
    ("options", "field"),
    [({"threads": 0}, "threads"), ({"weight_layout": "packed"}, "weight_layout")],
)
def test_bad_options(tiny_gguf: Path, options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        LocalBackend(str(tiny_gguf), **options)
    assert caught.value.field == field


def test_transformers_runner_refuses_llama_cpp_options(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"llama\.cpp runner") as caught:
        LocalBackend(str(tiny_model_dir), context_window=64)
    assert caught.value.field == "context_window"
