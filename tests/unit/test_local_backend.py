"""LocalBackend on tiny random models: exactness, streaming, stop strings, errors, threads."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from local_runners import ADD_TOOL, RUNNERS, plain_greedy, require_llama_cpp  # noqa: E402
from speculative_llm import (  # noqa: E402
    BackendError,
    Chunk,
    Completion,
    ConfigError,
    GenerationRequest,
    Message,
    ModelNotFoundError,
    SpecConfig,
    SpecStats,
    UnsupportedFeatureError,
    VocabularyMismatchError,
    create_backend,
)
from speculative_llm.backends.local import LocalBackend  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
MAX_TOKENS = 40


@pytest.fixture(scope="module", params=RUNNERS)
def runner_name(request: pytest.FixtureRequest) -> str:
    if request.param == "llamacpp":
        require_llama_cpp()
    return str(request.param)


@pytest.fixture(scope="module")
def model_path(runner_name: str, tiny_model_dir: Path, request: pytest.FixtureRequest) -> Path:
    """The tiny target in the runner's format (the GGUF is the same model, Q8_0)."""
    if runner_name == "llamacpp":
        path: Path = request.getfixturevalue("tiny_gguf")
        return path
    return tiny_model_dir


@pytest.fixture(scope="module")
def draft_path(runner_name: str, tiny_draft_dir: Path, request: pytest.FixtureRequest) -> Path:
    if runner_name == "llamacpp":
        path: Path = request.getfixturevalue("tiny_draft_gguf")
        return path
    return tiny_draft_dir


@pytest.fixture(scope="module")
def mismatched_path(
    runner_name: str, tiny_mismatched_dir: Path, request: pytest.FixtureRequest
) -> Path:
    if runner_name == "llamacpp":
        path: Path = request.getfixturevalue("tiny_mismatched_gguf")
        return path
    return tiny_mismatched_dir


def _open(path: Path, runner_name: str, **options: Any) -> LocalBackend:
    extra = {"dtype": "float32"} if runner_name == "transformers" else {"threads": 1}
    return LocalBackend(str(path), runner=runner_name, **{**extra, **options})


@pytest.fixture(scope="module")
def backend(model_path: Path, runner_name: str) -> Any:
    """A ``LocalBackend`` on the tiny target with prompt lookup, fixed k=4, on each runner."""
    local = _open(
        model_path, runner_name, speculative={"method": "ngram", "k": 4, "cost_aware": False}
    )
    assert local.runner_name == runner_name
    yield local
    local.close()


@pytest.fixture(scope="module")
def draft_backend(model_path: Path, draft_path: Path, runner_name: str) -> Any:
    local = _open(model_path, runner_name, draft_model=str(draft_path))
    yield local
    local.close()


@pytest.fixture(scope="module")
def greedy_text(backend: LocalBackend, runner_name: str, tiny_model_dir: Path) -> str:
    """Plain greedy decoding's text: transformers' ``generate``, or one-token passes."""
    if runner_name == "llamacpp":
        prompt = backend.encode_prompt(_request())
        ids = plain_greedy(
            backend.model.new_runner(), prompt, MAX_TOKENS, backend.engine.eos_token_ids
        )
        return backend.tokenizer.decode(ids)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt = tokenizer(PROMPT).input_ids
    output = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=MAX_TOKENS,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    text: str = tokenizer.decode(output[0, len(prompt) :], skip_special_tokens=True)
    return text


def _request(**changes: Any) -> GenerationRequest:
    return GenerationRequest(**{"prompt": PROMPT, "max_tokens": MAX_TOKENS, **changes})


SPECS = {
    "none": SpecConfig.baseline(),
    # Fixed drafts: these tests are about what drafts do, not whether they pay.
    "ngram": SpecConfig(method="ngram", num_speculative_tokens=4, cost_aware=False),
    "ngram-adaptive": SpecConfig(
        method="ngram", num_speculative_tokens=2, adaptive=True, max_speculative_tokens=8
    ),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_text_equals_plain_greedy_decoding(
    backend: LocalBackend, greedy_text: str, name: str
) -> None:
    completion = backend.generate(_request(spec=SPECS[name]))
    assert completion.text == greedy_text
    assert completion.stats.method == SPECS[name].method
    assert completion.stats.source == "exact"


def test_draft_model_greedy_text_equals_plain_greedy_decoding(
    draft_backend: LocalBackend, greedy_text: str, draft_path: Path
) -> None:
    for spec in (
        None,  # the backend's default: draft_model
        SpecConfig(
            method="draft_model",
            draft_model=str(draft_path),
            num_speculative_tokens=2,
            adaptive=True,
            min_speculative_tokens=1,
            max_speculative_tokens=6,
        ),
    ):
        completion = draft_backend.generate(_request(spec=spec))
        assert completion.text == greedy_text
        assert completion.stats.method == "draft_model"
        # The default is cost-aware: it drafts only where the draft model's passes pay,
        # which a draft about as dear as its target may never do. A fixed or adaptive k
        # always drafts.
        if spec is not None:
            assert completion.stats.accepted_tokens


def test_stream_yields_one_chunk_per_verify_step(backend: LocalBackend) -> None:
    chunks = list(backend.stream(_request()))
    final = chunks[-1]
    assert final.final and all(not chunk.final for chunk in chunks[:-1])
    stats = final.stats
    assert stats is not None and stats.source == "exact" and stats.backend == "local"
    assert len(chunks) == stats.verify_steps
    tokens = [token for chunk in chunks for token in chunk.tokens]
    assert all(chunk.text == "".join(t.text for t in chunk.tokens) for chunk in chunks)
    # Every token is accounted for, with its provenance.
    assert stats.generated_tokens == len(tokens) == MAX_TOKENS
    assert stats.accepted_tokens == sum(1 for t in tokens if t.provenance == "draft")
    assert stats.generated_tokens - stats.accepted_tokens == sum(
        1 for t in tokens if t.provenance == "target"
    )
    assert stats.accepted_tokens > 0
    # One target token per verify step (correction or bonus); drafts before it.
    for chunk in chunks:
        provenances = [t.provenance for t in chunk.tokens]
        assert provenances == sorted(provenances)  # 'draft' < 'target'
        assert provenances.count("target") == 1
    assert stats.mean_accepted_length == pytest.approx(len(tokens) / len(chunks))
    assert final.finish_reason == "length"
    assert final.usage is not None and final.usage.completion_tokens == MAX_TOKENS
    assert stats.ttft_s is not None and stats.decode_s is not None and stats.total_s is not None
    assert stats.ttft_s + stats.decode_s == pytest.approx(stats.total_s)
    assert stats.draft_s is not None and stats.verify_s is not None


def test_live_stats_grow_with_the_stream(backend: LocalBackend) -> None:
    generated = [
        chunk.stats.generated_tokens
        for chunk in backend.stream(_request())
        if chunk.stats is not None
    ]
    assert generated == sorted(generated)
    assert generated[0] == 1  # the prefill's token


def test_baseline_has_no_drafts(backend: LocalBackend) -> None:
    completion = backend.generate(_request(spec=SpecConfig.baseline()))
    stats = completion.stats
    assert stats.draft_tokens == 0 and stats.accepted_tokens == 0
    assert stats.verify_steps == stats.generated_tokens == MAX_TOKENS
    assert stats.num_speculative_tokens == 0
    assert all(token.provenance == "target" for token in completion.tokens)


def test_stop_string_ends_the_text_before_it(backend: LocalBackend) -> None:
    full = backend.generate(_request()).text
    stop = full[12:15]
    cut = full.index(stop)
    chunks = list(backend.stream(_request(stop=(stop, "\x00never"))))
    streamed = "".join(chunk.text for chunk in chunks)
    assert streamed == full[:cut]
    assert stop not in streamed
    final = chunks[-1]
    assert final.finish_reason == "stop"
    stats = final.stats
    assert stats is not None
    tokens = [token for chunk in chunks for token in chunk.tokens]
    assert stats.generated_tokens == len(tokens)
    assert stats.accepted_tokens == sum(1 for t in tokens if t.provenance == "draft")


def test_stream_holds_back_a_possible_stop_prefix(backend: LocalBackend) -> None:
    """Text that may begin a stop string is held back, and released once it cannot."""
    plain = list(backend.stream(_request()))
    full = "".join(chunk.text for chunk in plain)
    assert plain[0].text == full[:1]  # without stop strings the first token comes at once
    # A stop string starting like the output but never completed.
    stop = full[:3] + "\x01"
    chunks = list(backend.stream(_request(stop=(stop,))))
    assert chunks[0].text == "" and chunks[0].tokens == ()  # held: it may begin the stop
    assert "".join(chunk.text for chunk in chunks) == full  # released, nothing lost
    assert chunks[-1].finish_reason == "length"


def test_messages_use_the_chat_template(backend: LocalBackend) -> None:
    request = GenerationRequest(messages=(Message("user", "hello"),), max_tokens=5)
    ids = backend.encode_prompt(request)
    # tiny_models.CHAT_TEMPLATE: the BOS token, "<role>content" lines, then "<assistant>".
    assert ids[0] == 1
    assert backend.tokenizer.decode(ids) == "<user>hello\n<assistant>"
    assert backend.generate(request).stats.generated_tokens == 5


def test_seeded_sampling_is_reproducible(backend: LocalBackend) -> None:
    request = _request(temperature=1.0, seed=11)
    first = backend.generate(request)
    again = backend.generate(request)
    other = backend.generate(request.replace(seed=12))
    assert first.text == again.text
    assert first.text != other.text


def test_a_seed_gives_the_baseline_s_sample_whatever_the_lookup_drafts(
    backend: LocalBackend,
) -> None:
    request = _request(temperature=1.0, seed=11)
    baseline = backend.generate(request.replace(spec=SpecConfig.baseline())).text
    for spec in (
        SpecConfig(method="ngram", num_speculative_tokens=4, cost_aware=False),
        SpecConfig(method="ngram"),  # cost-aware: draft lengths chosen from timings
        SpecConfig(method="suffix", num_speculative_tokens=3, cost_aware=False),
    ):
        assert backend.generate(request.replace(spec=spec)).text == baseline, spec


def test_top_k_one_sampling_is_greedy(backend: LocalBackend, greedy_text: str) -> None:
    completion = backend.generate(_request(temperature=0.7, top_k=1, seed=5))
    assert completion.text == greedy_text


def test_capabilities_and_registry(model_path: Path, runner_name: str) -> None:
    backend = create_backend("local", model=str(model_path), speculative="none", runner=runner_name)
    assert isinstance(backend, LocalBackend)
    caps = backend.capabilities
    assert caps.methods == frozenset({"none", "ngram", "suffix", "draft_model"})
    assert caps.per_request_stats and caps.token_provenance and caps.per_request_toggle
    assert backend.default_spec.method == "none"
    assert backend.model_info().context_window == 2048
    backend.close()


# ---- bad input ---------------------------------------------------------------------------


def test_the_default_is_cost_aware_prompt_lookup(model_path: Path, runner_name: str) -> None:
    from speculative_llm.backends.local import DEFAULT_SPEC

    with _open(model_path, runner_name) as local:
        assert local.default_spec == DEFAULT_SPEC
        assert DEFAULT_SPEC.method == "ngram" and DEFAULT_SPEC.is_cost_aware
        assert local.generate(_request()).stats.method == "ngram"


def test_unknown_method(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="Unknown speculative method"):
        LocalBackend(str(tiny_model_dir), speculative={"method": "ngarm"})


def test_method_the_engine_lacks(backend: LocalBackend, tiny_model_dir: Path) -> None:
    with pytest.raises(UnsupportedFeatureError, match="eagle"):
        backend.generate(_request(spec=SpecConfig(method="eagle")))
    with pytest.raises(ConfigError, match="does not implement"):
        LocalBackend(str(tiny_model_dir), speculative="mtp")


@pytest.mark.parametrize("k", [0, -1])
def test_k_below_one(tiny_model_dir: Path, k: int) -> None:
    with pytest.raises(ConfigError, match="num_speculative_tokens must be >= 1"):
        LocalBackend(str(tiny_model_dir), speculative={"method": "ngram", "k": k})


def test_draft_model_method_without_a_draft(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="needs draft_model") as caught:
        LocalBackend(str(tiny_model_dir), speculative={"method": "draft_model"})
    assert caught.value.field == "draft_model"


def test_vocabulary_mismatch(model_path: Path, mismatched_path: Path, runner_name: str) -> None:
    with pytest.raises(VocabularyMismatchError, match="method='ngram'") as caught:
        _open(model_path, runner_name, draft_model=str(mismatched_path))
    assert "different vocabulary" in str(caught.value)


def test_vocabulary_mismatch_on_a_request(backend: LocalBackend, mismatched_path: Path) -> None:
    spec = SpecConfig(method="draft_model", draft_model=str(mismatched_path))
    with pytest.raises(VocabularyMismatchError):
        backend.generate(_request(spec=spec))


def test_unknown_model_path(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        LocalBackend(str(tmp_path / "no-such-model"))


def test_empty_prompt_and_bad_max_tokens() -> None:
    with pytest.raises(ConfigError, match="prompt is empty"):
        GenerationRequest(prompt="   ")
    for bad in (0, -5):
        with pytest.raises(ConfigError, match="max_tokens must be > 0"):
            GenerationRequest(prompt="hi", max_tokens=bad)


# ---- tool calling ------------------------------------------------------------------------

ADD = ADD_TOOL
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 3}},
            "required": ["text"],
        },
    },
}


def _tool_request(**changes: Any) -> GenerationRequest:
    options = {
        "messages": (Message("user", "Add 2 and 3."),),
        "max_tokens": 80,
        "tools": (ADD, ECHO),
        **changes,
    }
    return GenerationRequest(**options)


@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [
        ("required", {"add", "echo"}),
        ({"type": "function", "function": {"name": "echo"}}, {"echo"}),
        ("add", {"add"}),
    ],
)
def test_a_required_tool_call_is_always_well_formed(
    backend: LocalBackend, tool_choice: Any, names: set[str]
) -> None:
    pytest.importorskip("xgrammar", reason="tool calls need xgrammar (extra 'local')")
    completion = backend.generate(_tool_request(tool_choice=tool_choice))
    if completion.finish_reason == "length":  # a tiny random model may run out of budget
        assert completion.text.startswith("{") and not completion.tool_calls
        return
    assert completion.finish_reason == "tool_calls" and completion.text == ""
    (call,) = completion.tool_calls
    assert call.name in names and call.id.startswith("call_")
    if call.name == "add":
        assert set(call.arguments) == {"a", "b"}
        assert all(isinstance(value, int) for value in call.arguments.values())
    else:
        assert isinstance(call.arguments["text"], str) and len(call.arguments["text"]) <= 3
    assert completion.stats.source == "exact" and completion.stats.generated_tokens


def test_tools_are_described_to_a_template_without_tool_support(backend: LocalBackend) -> None:
    prompt = backend.tokenizer.decode(backend.encode_prompt(_tool_request()))
    assert "You can call these tools:" in prompt and "- add: Add two integers." in prompt
    assert '{"answer": <your answer>}' in prompt  # auto: a direct answer is allowed
    required = backend.tokenizer.decode(
        backend.encode_prompt(_tool_request(tool_choice="required"))
    )
    assert '{"answer"' not in required
    # tool_choice "none": the tools are neither shown nor enforced.
    plain = _tool_request(tool_choice="none")
    assert backend.encode_prompt(plain) == backend.encode_prompt(plain.replace(tools=None))


def test_streamed_tool_calls_come_on_the_last_chunk(backend: LocalBackend) -> None:
    pytest.importorskip("xgrammar", reason="tool calls need xgrammar (extra 'local')")
    request = _tool_request(tool_choice="required", max_tokens=60)
    # The prompt's progress reports (its tool schema makes it long) come first.
    chunks = [chunk for chunk in backend.stream(request) if not chunk.is_progress]
    # Before the last chunk: live statistics only (the raw JSON is not the content).
    assert all(not c.text and not c.tool_calls and c.stats for c in chunks[:-1])
    final = chunks[-1]
    assert final.final and final.stats is not None
    whole = backend.generate(request)
    assert [(c.name, c.arguments) for c in final.tool_calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    assert final.finish_reason == whole.finish_reason


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"tool_choice": "subtract"}, "tool_choice", "names no offered tool"),
        (
            {"tools": ({"type": "function", "function": {"parameters": {}}},)},
            "tools",
            "no function name",
        ),
        (
            {
                "tools": (
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    },
                )
            },
            "tools",
            "must be a JSON object schema",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format", "not both"),
    ],
)
def test_bad_tools_are_config_errors(
    backend: LocalBackend, changes: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        backend.generate(_tool_request(**changes))
    assert caught.value.field == field


def test_closed_backend_refuses(model_path: Path, runner_name: str) -> None:
    backend = _open(model_path, runner_name)
    backend.close()
    with pytest.raises(BackendError, match="closed"):
        backend.generate(_request())


def test_close_during_an_open_stream_does_not_block(model_path: Path, runner_name: str) -> None:
    backend = _open(model_path, runner_name)
    stream = backend.stream(_request())
    next(stream)  # the stream holds the engine lock, in this very thread
    backend.close()  # must not deadlock
    rest = list(stream)  # the running generation finishes normally
    assert rest[-1].final and rest[-1].stats is not None
    assert rest[-1].stats.generated_tokens == MAX_TOKENS
    assert backend.engine.models_released  # and the models are freed when it ends
    with pytest.raises(BackendError, match="closed"):
        backend.engine.runner.reset()  # its runner was closed with them
    with pytest.raises(BackendError, match="closed"):
        backend.generate(_request())


def test_a_stream_read_after_close_refuses_before_any_pass(
    model_path: Path, runner_name: str
) -> None:
    """A request checked before ``close`` and read after it names the backend, not a runner."""
    backend = _open(model_path, runner_name)
    stream = backend.stream(_request())
    chunks = backend.astream(_request())
    backend.close()
    with pytest.raises(BackendError, match="This LocalBackend is closed"):
        next(stream)

    async def first_chunk() -> Any:
        return await anext(chunks)

    with pytest.raises(BackendError, match="This LocalBackend is closed"):
        asyncio.run(first_chunk())


# ---- concurrency and cancellation -------------------------------------------------------


def test_every_pass_runs_on_the_one_engine_thread(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passes from several threads give OpenMP one pool each: half speed (engine_thread)."""
    threads: set[str] = set()
    forward = type(backend.engine.runner).forward

    def recording(runner: Any, *args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return forward(runner, *args, **kwargs)

    monkeypatch.setattr(type(backend.engine.runner), "forward", recording)

    async def async_calls() -> None:
        await backend.agenerate(_request())
        [chunk async for chunk in backend.astream(_request())]

    backend.generate(_request())
    list(backend.stream(_request()))
    asyncio.run(async_calls())
    elsewhere = threading.Thread(target=lambda: backend.generate(_request()))
    elsewhere.start()
    elsewhere.join()
    backend.logit_margin(_request(), [])
    assert len(threads) == 1 and threads.pop().startswith("speculative-llm-engine")


def test_logit_margin_builds_no_autograd_graph(backend: LocalBackend, runner_name: str) -> None:
    """Its pass runs as the loop's do, without gradients (a transformers model records them)."""
    if runner_name != "transformers":
        pytest.skip("only a torch model records an autograd graph")
    grad_enabled: list[bool] = []
    model = backend.engine.runner.model  # type: ignore[attr-defined]
    # Every module: the runner may call the decoder and the output head without the model.
    hooks = [
        module.register_forward_pre_hook(lambda *_: grad_enabled.append(torch.is_grad_enabled()))
        for module in model.modules()
    ]
    try:
        margin = backend.logit_margin(_request(), [])
    finally:
        for hook in hooks:
            hook.remove()
    assert grad_enabled and not any(grad_enabled)
    assert margin >= 0.0


async def test_a_refused_request_raises_at_once_or_at_its_first_chunk(
    backend: LocalBackend,
) -> None:
    refused = _request(spec=SpecConfig(method="eagle"))
    with pytest.raises(UnsupportedFeatureError, match="eagle"):
        backend.stream(refused)  # before any chunk is asked for
    with pytest.raises(UnsupportedFeatureError, match="eagle"):
        await backend.agenerate(refused)
    with pytest.raises(UnsupportedFeatureError, match="eagle"):
        [chunk async for chunk in backend.astream(refused)]
    assert not backend.engine._lock.locked()
    assert backend.generate(_request()).stats.generated_tokens == MAX_TOKENS


def test_closing_a_stream_frees_the_engine(backend: LocalBackend) -> None:
    stream = backend.stream(_request(max_tokens=200))
    first = next(stream)
    assert isinstance(first, Chunk) and not first.final
    assert backend.engine._lock.locked()
    stream.close()  # type: ignore[attr-defined]
    assert not backend.engine._lock.locked()
    # And the next request runs normally from a clean state.
    assert backend.generate(_request()).stats.generated_tokens == MAX_TOKENS


async def test_abandoned_async_stream_frees_the_engine(
    backend: LocalBackend, greedy_text: str
) -> None:
    async for chunk in backend.astream(_request(max_tokens=200)):
        assert chunk.tokens
        break
    # The worker thread closes the stream after the consumer left.
    for _ in range(200):
        if not backend.engine._lock.locked():
            break
        await asyncio.sleep(0.05)
    assert not backend.engine._lock.locked()
    completion = await backend.agenerate(_request())
    assert completion.text == greedy_text


def test_concurrent_requests_both_complete(backend: LocalBackend, greedy_text: str) -> None:
    sampled_request = _request(temperature=0.9, seed=3)
    expected_sampled = backend.generate(sampled_request).text
    results: dict[str, Completion] = {}
    errors: list[BaseException] = []

    def run(name: str, request: GenerationRequest) -> None:
        try:
            results[name] = backend.generate(request)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [
        threading.Thread(target=run, args=("greedy", _request())),
        threading.Thread(target=run, args=("sampled", sampled_request)),
        threading.Thread(target=run, args=("baseline", _request(spec=SpecConfig.baseline()))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert results["greedy"].text == greedy_text
    assert results["baseline"].text == greedy_text
    assert results["sampled"].text == expected_sampled


async def test_concurrent_async_requests(backend: LocalBackend, greedy_text: str) -> None:
    completions = await asyncio.gather(
        backend.agenerate(_request()),
        backend.agenerate(_request(spec=SpecConfig.baseline())),
    )
    assert [c.text for c in completions] == [greedy_text, greedy_text]


# ---- structured output -------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _json_request(response_format: dict[str, Any], **changes: Any) -> GenerationRequest:
    return _request(**{"response_format": response_format, "max_tokens": 60, **changes})


@pytest.mark.parametrize("spec_name", ["none", "ngram"])
def test_a_json_schema_constrains_the_output(backend: LocalBackend, spec_name: str) -> None:
    import json

    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (extra 'local')")
    request = _json_request(
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        spec=SPECS[spec_name],
    )
    completion = backend.generate(request)
    if completion.finish_reason == "stop":
        value = json.loads(completion.text)
        assert set(value) == {"name", "age"} and isinstance(value["age"], int)
    else:  # the budget ran out first: a prefix of such a JSON object
        assert completion.finish_reason == "length"
        assert completion.text.startswith('{"name": "')
    # Greedy constrained speculation gives the constrained baseline's text.
    baseline = backend.generate(request.replace(spec=SpecConfig.baseline()))
    assert completion.text == baseline.text
    # The grammar's cuts are counted when there is a grammar, and only then.
    assert baseline.stats.grammar_cut_tokens == 0  # nothing drafted, nothing cut
    assert completion.stats.grammar_cut_tokens is not None
    assert backend.generate(_request(spec=SPECS[spec_name])).stats.grammar_cut_tokens is None


def test_prompt_lookup_drafts_the_grammar_forbids_are_cut_and_counted(
    backend: LocalBackend,
) -> None:
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (extra 'local')")
    # Every digit in the prompt is followed by a letter, which prompt lookup then drafts
    # after each digit the model writes; the grammar allows only digits.
    request = GenerationRequest(
        prompt="0a1a2a3a4a5a6a7a8a9a" * 2,
        max_tokens=20,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": {"type": "integer"}},
        },
        spec=SPECS["ngram"],
    )
    completion = backend.generate(request)
    assert completion.text.strip().lstrip("-").isdigit()
    assert completion.stats.grammar_cut_tokens and completion.stats.grammar_cut_tokens > 0


def test_json_object_gives_json_and_text_is_free(backend: LocalBackend) -> None:
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (extra 'local')")
    constrained = backend.generate(_json_request({"type": "json_object"}, max_tokens=8))
    assert constrained.text[:1] in '{["-0123456789tfn'  # a JSON value starts
    free = backend.generate(_json_request({"type": "text"}))
    assert free.text == backend.generate(_request(max_tokens=60)).text


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "under 'schema'"),
        ({"type": "json_schema", "json_schema": {"schema": "{broken"}}, "not valid JSON"),
        ({"type": "yaml"}, "Unknown response_format type 'yaml'"),
    ],
)
def test_bad_response_formats_are_config_errors(
    backend: LocalBackend, response_format: dict[str, Any], message: str
) -> None:
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (extra 'local')")
    with pytest.raises(ConfigError, match=message) as caught:
        backend.generate(_json_request(response_format))
    assert caught.value.field == "response_format"


def test_each_request_reports_its_own_kernel_and_grammar_seconds(
    backend: LocalBackend, runner_name: str
) -> None:
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (extra 'local')")
    free = [backend.generate(_request(spec=SPECS["ngram"])) for _ in range(2)]
    constrained = backend.generate(_json_request({"type": "json_object"}, max_tokens=8))
    for completion in (*free, constrained):
        stats = completion.stats
        if runner_name == "llamacpp":
            # Only this request's passes: never more than its own decode time.
            assert stats.kernel_s is not None and stats.decode_s is not None
            assert 0 <= stats.kernel_s <= stats.decode_s
        else:
            assert stats.kernel_s is None  # transformers' forward is not timed
    if runner_name == "llamacpp":
        assert all(completion.stats.kernel_s for completion in free)
    assert all(completion.stats.grammar_s is None for completion in free)
    grammar_s = constrained.stats.grammar_s
    assert grammar_s is not None and constrained.stats.total_s is not None
    assert 0 < grammar_s <= constrained.stats.total_s
    pooled = SpecStats.aggregate([free[0].stats, constrained.stats])
    assert pooled is not None and pooled.grammar_s is None  # missing from one record


def test_a_corrupt_draft_model_is_named_as_the_draft(
    model_path: Path, runner_name: str, tmp_path: Path
) -> None:
    corrupt = tmp_path / "draft.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + b"garbage-" * 16)
    with pytest.raises(ConfigError) as caught:
        _open(model_path, runner_name, draft_model=str(corrupt))
    assert caught.value.field == "draft_model"
