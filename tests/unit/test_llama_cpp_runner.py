"""The llama.cpp runner on tiny GGUF files: cache crops, the layout probe, threads, errors."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="writing tiny GGUF files needs gguf (extra 'transformers')")

from local_runners import plain_greedy, require_llama_cpp  # noqa: E402
from speculative_llm import (  # noqa: E402
    ConfigError,
    GenerationRequest,
    ModelNotFoundError,
    SpecConfig,
)
from speculative_llm.backends.local import LocalBackend  # noqa: E402
from speculative_llm.cpu_features import has_amx  # noqa: E402
from speculative_llm.engine.loop.engine import prefill  # noqa: E402
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.models.loading import choose_runner  # noqa: E402
from speculative_llm.engine.models.sources import resolve_model  # noqa: E402
from speculative_llm.engine.runners.llama_cpp import layout_probe  # noqa: E402
from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib  # noqa: E402
from speculative_llm.engine.runners.llama_cpp import model as llama_cpp_model  # noqa: E402
from speculative_llm.engine.runners.llama_cpp.layout_probe import LayoutProbe  # noqa: E402
from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel  # noqa: E402
from speculative_llm.engine.runners.llama_cpp.runner import (  # noqa: E402
    ThreadPlan,
    exact_verify_rows,
)
from speculative_llm.faults import CRASH_ENV  # noqa: E402
from tiny_models import (  # noqa: E402  # noqa: E402
    DECODE_PROMPT,
    load_float32,
    logits_along_a_decode,
    tiny_vocabulary,
    write_gguf,
)


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probe-cache")


@pytest.fixture(autouse=True)
def _llama_cpp(_module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_llama_cpp()
    # The probe cache lives with the model cache: one per module (a probe is a child
    # process), a fresh one in the tests of the cache itself.
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(_module_cache))


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def model(tiny_gguf: Path, _module_cache: Path) -> Any:
    require_llama_cpp()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECULATIVE_LLM_CACHE", str(_module_cache))
        loaded = LlamaCppModel(tiny_gguf, threads=1, exact="bitwise")
    yield loaded
    loaded.close()


def skip_repacked_on_amx(layout: str) -> None:
    """A stand-in probe that says 'repacked survives' must not be believed on AMX CPUs.

    There the parent would load the repacked layout in-process, into llama.cpp's AMX
    kernels, which crash (llama.cpp issue 20824): the real probe, in a child, is tested
    by ``test_a_layout_that_kills_its_probe_is_never_loaded`` instead.
    """
    from speculative_llm.cpu_features import has_amx
    from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib

    if layout == "repacked" and has_amx(llama_cpp_lib.load().system_info):
        pytest.skip(
            "this CPU has AMX: loading the repacked layout in-process would crash llama.cpp's "
            "AMX kernels (llama.cpp issue 20824)"
        )


def _probes(**by_layout: dict[str, Any]) -> Any:
    """A stand-in for the child process: the probe results given per layout."""

    def probe(path: Path, layouts: Any, **options: Any) -> dict[str, LayoutProbe]:
        return {
            layout: LayoutProbe(layout=layout, threads=options["threads"], **by_layout[layout])
            for layout in layouts
        }

    return probe


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
    assert all(np.array_equal(a, b) for a, b in zip(seen, again, strict=True))
    # The verify pass's rows equal decoding the same tokens one at a time.
    first.reset()
    first.forward(DECODE_PROMPT, 1)
    singles = [first.forward([token], 1)[0].copy() for token in (5, 6, 7, 8)]
    assert all(np.array_equal(row, single) for row, single in zip(seen[1], singles, strict=True))
    first.close()
    second.close()


def test_the_probe_finds_exact_rows_and_bitwise_respects_them(model: Any) -> None:
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
    with LocalBackend(str(path), runner="llamacpp", threads=1, exact="bitwise") as backend:
        assert backend.model.exact_rows == 1
        request = GenerationRequest(prompt="def add(a, b):\n", max_tokens=20)
        baseline = backend.generate(request.replace(spec=SpecConfig.baseline()))
        speculative = backend.generate(
            request.replace(spec=SpecConfig(method="ngram", num_speculative_tokens=4))
        )
        assert speculative.text == baseline.text
        assert speculative.stats.draft_tokens == 0
        assert speculative.stats.verify_steps == speculative.stats.generated_tokens


def test_the_probe_runs_in_a_child_once_per_file_and_configuration(
    tiny_gguf: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    real = llama_cpp_model.probe_layouts

    def counting(path: Path, layouts: Any, **options: Any) -> dict[str, LayoutProbe]:
        calls.append(list(layouts))
        return real(path, layouts, **options)

    monkeypatch.setattr(llama_cpp_model, "probe_layouts", counting)
    # The default policy only needs to know the repacked layout survives: a quick probe.
    first = LlamaCppModel(tiny_gguf, threads=1)
    assert calls == [["repacked"]]
    cached = json.loads(layout_probe.probe_cache_path().read_text())
    assert [entry["probe"]["full"] for entry in cached.values()] == [False]
    # exact="bitwise" needs the full probe of both layouts, plain first (it never crashes).
    second = LlamaCppModel(tiny_gguf, threads=1, exact="bitwise")
    assert calls == [["repacked"], ["plain", "repacked"]]
    cached = json.loads(layout_probe.probe_cache_path().read_text())
    assert sorted(e["probe"]["layout"] for e in cached.values() if e["probe"]["full"]) == [
        "plain",
        "repacked",
    ]
    # The plain layout never crashes; the repacked one only where llama.cpp's AMX kernels
    # take it (llama.cpp issue 20824), and the loads above survived either way.
    amx = has_amx(llama_cpp_lib.load().system_info)
    crashed = {e["probe"]["layout"] for e in cached.values() if e["probe"]["crash_signal"]}
    assert crashed <= ({"repacked"} if amx else set())
    again = LlamaCppModel(tiny_gguf, threads=1, exact="bitwise")  # from the cache
    quick = LlamaCppModel(tiny_gguf, threads=1)  # a full probe answers a quick one too
    assert len(calls) == 2 and again.exact_rows == second.exact_rows
    plain = LlamaCppModel(tiny_gguf, threads=1, weight_layout="plain")  # nothing to probe
    assert len(calls) == 2 and plain.layout == "plain"
    third = LlamaCppModel(tiny_gguf, threads=1, context_window=64)  # another context: probed
    assert len(calls) == 3
    for loaded in (first, second, again, quick, plain, third):
        loaded.close()


def test_a_layout_that_kills_its_probe_is_never_loaded(
    tiny_gguf: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What happens on an Intel AMX CPU, where repacked weights crash llama.cpp."""
    monkeypatch.setenv(CRASH_ENV, "layout-probe:repacked")  # read by the probe child only
    loaded = LlamaCppModel(tiny_gguf, threads=1)
    assert loaded.probes["repacked"].crash_signal == signal.SIGSEGV
    assert loaded.layout == "plain"
    assert "repacked layout crashed" in loaded.describe() and "SIGSEGV" in loaded.describe()
    runner = loaded.new_runner()  # this process is alive and decodes
    assert runner.forward([1, 20, 30], 1).shape == (1, loaded.vocab_size)
    runner.close()
    loaded.close()
    # The verdict is cached: the next load spawns no child, and a managed llama-server
    # of the same file reads it.
    monkeypatch.setattr(llama_cpp_model, "probe_layouts", None)
    again = LlamaCppModel(tiny_gguf, threads=1)
    assert again.layout == "plain"
    again.close()
    verdict = layout_probe.repack_verdict(tiny_gguf)
    assert verdict is not None and verdict.crash_signal == signal.SIGSEGV
    with pytest.raises(ConfigError, match="SIGSEGV") as caught:
        LlamaCppModel(tiny_gguf, threads=1, weight_layout="repacked")
    assert caught.value.field == "weight_layout" and "'plain'" in str(caught.value)


@pytest.mark.parametrize(
    ("exact", "split_at", "fallback", "plan", "limit"),
    [
        ("distribution", 256, "rescore", ThreadPlan(2), None),
        ("bitwise", 256, "one_thread", ThreadPlan(2, exact_below=256), 17),
        ("bitwise", 256, "rescore", ThreadPlan(2, exact_below=256, fallback="rescore"), 17),
        ("bitwise", None, None, ThreadPlan(2), 17),
    ],
)
def test_the_exactness_policy_decides_threads_and_verify_rows(
    tiny_gguf: Path,
    fresh_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    exact: str,
    split_at: int | None,
    fallback: str | None,
    plan: ThreadPlan,
    limit: int | None,
) -> None:
    """llama.cpp's multi-thread one-token kernel (split-KV) rounds unlike its batches."""
    skip_repacked_on_amx("repacked")  # both layouts tie here: repacked is kept
    result = {"exact_rows": 17, "all_threads_exact_below": split_at, "fallback": fallback}
    monkeypatch.setattr(llama_cpp_model, "probe_layouts", _probes(plain=result, repacked=result))
    loaded = LlamaCppModel(tiny_gguf, threads=2, exact=exact)  # type: ignore[arg-type]
    assert (loaded.thread_plan, loaded.verify_rows_limit) == (plan, limit)
    runner = loaded.new_runner()
    assert runner.max_verify_tokens == limit
    assert (f"exact={exact!r}" in loaded.describe()) and plan.describe() in loaded.describe()
    runner.close()
    loaded.close()


def test_one_token_passes_switch_threads_at_the_plans_length(model: Any) -> None:
    runner = model.new_runner()
    runner.thread_plan = ThreadPlan(2, exact_below=10)
    runner.reset()
    first = runner.forward(list(range(10, 18)), 1)[0].copy()  # a batch: all threads
    assert first.shape == (model.vocab_size,)
    runner.forward([20], 1)  # 8 cached tokens: below the length
    assert runner.one_token_threads == 2
    runner.forward([21], 1)
    runner.forward([22], 1)  # 10 cached: from here one thread
    assert runner.one_token_threads == 1
    runner.crop(5)
    runner.forward([23], 1)
    assert runner.one_token_threads == 2
    assert ThreadPlan(2, exact_below=256).describe() == (
        "2 threads (1 for one-token passes past 256 cached tokens)"
    )
    assert ThreadPlan(1).describe() == "1 thread"
    runner.close()


class _DecodeSizes:
    """The binding, with the row count of every ``llama_decode`` written down."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.sizes: list[int] = []

    def llama_decode(self, context: Any, batch: Any) -> int:
        self.sizes.append(int(batch.n_tokens))
        return int(self._api.llama_decode(context, batch))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def test_a_rescored_one_token_pass_is_a_two_row_batch_with_the_logits_of_a_verify_row(
    model: Any,
) -> None:
    """Past the plan's length a one-token pass re-scores the token before it."""
    runner = model.new_runner()
    prompt, tail = list(range(10, 22)), [30, 31, 32, 33]
    runner.reset()
    runner.forward(prompt, 1)
    batched = runner.forward(tail, len(tail)).copy()
    runner.crop(len(prompt))
    runner.thread_plan = ThreadPlan(2, exact_below=14, fallback="rescore")
    spy = _DecodeSizes(runner._api)
    runner._api = spy
    rows = [runner.forward([token], 1)[0].copy() for token in tail]
    # 12 and 13 cached tokens: plain one-token passes; from 14 on, 2-row re-scores.
    assert spy.sizes == [1, 1, 2, 2]
    assert runner.length == len(prompt) + len(tail)
    assert all(np.array_equal(row, want) for row, want in zip(rows, batched, strict=True))
    # Cropped below and past the length again, the cache still holds the right tokens.
    runner.crop(len(prompt) + 2)
    again = runner.forward([tail[2]], 1)[0]
    assert spy.sizes[-1] == 2 and np.array_equal(again, batched[2])
    assert not ThreadPlan(2, exact_below=0, fallback="rescore").rescores(0)
    assert ThreadPlan(2, exact_below=256, fallback="rescore").describe() == (
        "2 threads (one-token passes past 256 cached tokens re-score the token before, as 2 rows)"
    )
    runner.close()


def test_a_long_prompt_takes_the_passes_of_one_llama_decode_over_it(model: Any) -> None:
    """The engine's prompt chunks are llama.cpp's own batch: no pass more than one call.

    llama.cpp splits one call over a long prompt (llama-server's prefill) into batches of
    ``n_ubatch`` rows; smaller chunks would add passes, each paying llama.cpp's thread
    barriers again.
    """
    runner = model.new_runner()
    spy = _DecodeSizes(runner._api)
    runner._api = spy
    prompt = [10 + index % 40 for index in range(2 * 512 + 76)]
    whole = runner.forward(prompt, 1)[0].copy()
    one_call, spy.sizes = spy.sizes, []
    first = prefill(runner, prompt, SamplingParams(), None)
    assert one_call == [512, 512, 76]
    assert sorted(spy.sizes) == sorted(one_call)  # the remainder comes first (prompt_passes)
    # Every pass has 64 rows or more, so the chunked prompt computes as the whole one.
    assert first.tokens == [int(np.argmax(whole))]
    assert np.array_equal(
        runner.forward([first.tokens[0]], 1)[0].copy(), _next_row(model, prompt, first)
    )
    runner.close()


def _next_row(model: Any, prompt: list[int], first: Any) -> Any:
    other = model.new_runner()
    try:
        other.forward(prompt, 1)
        return other.forward([first.tokens[0]], 1)[0].copy()
    finally:
        other.close()


def test_the_probe_result_keeps_its_fallback_measurements() -> None:
    probe = LayoutProbe(
        "plain",
        exact_rows=17,
        all_threads_exact_below=256,
        threads=2,
        fallback="rescore",
        fallback_ms={"one_thread": 20.5, "rescore": 16.8},
        fallback_exact_rows={"one_thread": 17, "rescore": 17},
    )
    assert LayoutProbe.from_json(json.loads(json.dumps(probe.to_json()))) == probe
    assert LayoutProbe.from_json({**probe.to_json(), "fallback": "two_threads"}) is None


@pytest.mark.parametrize(
    ("repacked", "plain", "exact", "layout"),
    [
        ({"exact_rows": 3}, {"exact_rows": 6}, "bitwise", "plain"),
        ({"exact_rows": 6}, {"exact_rows": 6}, "bitwise", "repacked"),
        ({"exact_rows": 3}, {"exact_rows": 6}, "distribution", "repacked"),
        ({"crash_signal": 11}, {"exact_rows": 2}, "distribution", "plain"),
        ({"crash_signal": 11}, {"exact_rows": 2}, "bitwise", "plain"),
    ],
)
def test_auto_layout_follows_the_policy_and_the_crashes(
    tiny_gguf: Path,
    fresh_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    repacked: dict[str, Any],
    plain: dict[str, Any],
    exact: str,
    layout: str,
) -> None:
    skip_repacked_on_amx(layout)
    monkeypatch.setattr(llama_cpp_model, "probe_layouts", _probes(repacked=repacked, plain=plain))
    loaded = LlamaCppModel(tiny_gguf, threads=1, exact=exact)  # type: ignore[arg-type]
    assert loaded.layout == layout
    assert f"{layout} weights" in loaded.describe()
    runner = loaded.new_runner()  # the kept layout's weights decode
    runner.reset()
    assert runner.forward([1, 20, 30], 1).shape == (1, loaded.vocab_size)
    runner.close()
    loaded.close()


def test_a_probe_that_cannot_run_falls_back_to_the_safe_layout(
    tiny_gguf: Path, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*arguments: Any, **options: Any) -> Any:
        raise llama_cpp_model.BackendError("no child processes here")

    monkeypatch.setattr(llama_cpp_model, "probe_layouts", broken)
    monkeypatch.setattr(llama_cpp_model, "has_amx", lambda system_info: True)
    loaded = LlamaCppModel(tiny_gguf, threads=2, exact="bitwise")
    # AMX without a probe: no repacking; bitwise without a probe: one row, one thread.
    assert (loaded.layout, loaded.verify_rows_limit) == ("plain", 1)
    assert loaded.thread_plan == ThreadPlan(2, exact_below=0)
    assert "not probed" in loaded.describe()
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
    with LocalBackend(
        str(tiny_gguf), draft_model=str(tiny_draft_gguf), threads=1, exact="bitwise"
    ) as backend:
        prompt = "def add(a, b):\n    return a + b\n"
        # A fixed k: the default cost-aware policy would not draft with a draft model
        # as dear as this target, and the test is about the drafts.
        fixed = SpecConfig(
            method="draft_model",
            draft_model=str(tiny_draft_gguf),
            num_speculative_tokens=4,
            cost_aware=False,
        )
        request = GenerationRequest(prompt=prompt, max_tokens=30, spec=fixed)
        completion = backend.generate(request)
        reference = plain_greedy(
            backend.model.new_runner(),
            backend.encode_prompt(request),
            30,
            backend.engine.eos_token_ids,
        )
        assert [token.id for token in completion.tokens] == reference
        assert completion.stats.method == "draft_model" and completion.stats.accepted_tokens


def test_a_restarted_sequence_keeps_its_prefix_and_the_logits_of_a_fresh_one(model: Any) -> None:
    """``restart_from`` keeps the shared prefix; the rest of a prompt scores as from scratch."""
    reused, fresh = model.new_runner(), model.new_runner()
    first_prompt = [*DECODE_PROMPT, 5, 6, 7]
    reused.forward(first_prompt, 1)
    assert list(reused.cached_tokens) == first_prompt
    before = reused.kernel_seconds
    reused.restart_from(len(DECODE_PROMPT))
    assert list(reused.cached_tokens) == DECODE_PROMPT and reused.length == len(DECODE_PROMPT)
    rows = reused.forward([9, 10], 1)[0].copy()
    # The rest of the prompt is that sequence's prompt pass: time to first token.
    assert reused.kernel_seconds == before
    assert np.array_equal(rows, fresh.forward([*DECODE_PROMPT, 9, 10], 1)[0])
    assert list(reused.cached_tokens) == [*DECODE_PROMPT, 9, 10]
    reused.restart_from(0)
    assert reused.length == 0 and not reused.cached_tokens
    reused.close()
    fresh.close()


def test_a_request_starts_from_the_prefix_the_last_one_left(tiny_gguf: Path) -> None:
    """An agent's next call repeats its last prompt: only the new tokens get a pass."""
    first = GenerationRequest(prompt="def add(a, b):\n    return a + b\n", max_tokens=12)
    with LocalBackend(str(tiny_gguf), threads=1) as backend:
        assert backend.prompt_cache
        answer = backend.generate(first)
        assert answer.stats.cached_prompt_tokens == 0
        follow_up = first.replace(prompt=f"{first.prompt}{answer.text}\ndef sub(")
        cached = backend.generate(follow_up)
        shared = len(backend.encode_prompt(first))
        assert cached.stats.cached_prompt_tokens is not None
        assert cached.stats.cached_prompt_tokens >= shared
        assert cached.stats.prompt_tokens > cached.stats.cached_prompt_tokens
        uncached = backend.generate(follow_up.replace(extra={"cache_prompt": False}))
        assert uncached.stats.cached_prompt_tokens == 0
        assert [t.id for t in cached.tokens] == [t.id for t in uncached.tokens]
        # The same prompt again: everything but its last token comes from the cache.
        again = backend.generate(follow_up)
        assert again.stats.cached_prompt_tokens == cached.stats.prompt_tokens - 1
        assert [t.id for t in again.tokens] == [t.id for t in uncached.tokens]
    with LocalBackend(str(tiny_gguf), threads=1, prompt_cache=False) as backend:
        backend.generate(first)
        assert backend.generate(first).stats.cached_prompt_tokens == 0


def test_bitwise_keeps_no_prompt_cache(tiny_gguf: Path) -> None:
    request = GenerationRequest(prompt="def add(a, b):\n", max_tokens=4)
    with LocalBackend(str(tiny_gguf), threads=1, exact="bitwise") as backend:
        assert not backend.prompt_cache
        backend.generate(request)
        assert backend.generate(request).stats.cached_prompt_tokens == 0
        with pytest.raises(ConfigError, match="bitwise") as caught:
            backend.generate(request.replace(extra={"cache_prompt": True}))
        assert caught.value.field == "cache_prompt"
        with pytest.raises(ConfigError, match="true or false"):
            backend.generate(request.replace(extra={"cache_prompt": "on"}))


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
    [
        ({"threads": 0}, "threads"),
        ({"weight_layout": "packed"}, "weight_layout"),
        ({"exact": "roughly"}, "exact"),
        ({"prompt_cache": "yes"}, "prompt_cache"),
    ],
)
def test_bad_options(tiny_gguf: Path, options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        LocalBackend(str(tiny_gguf), **options)
    assert caught.value.field == field


def test_transformers_runner_refuses_llama_cpp_options(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"llama\.cpp runner") as caught:
        LocalBackend(str(tiny_model_dir), context_window=64)
    assert caught.value.field == "context_window"
