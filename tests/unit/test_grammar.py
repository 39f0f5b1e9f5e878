"""Grammar-constrained speculative decoding: exact for the masked distribution, on both runners.

Greedy: constrained speculative output equals constrained plain decoding token for
token, and the grammar cuts drafts it forbids before they are verified. Sampled: a
chi-squared test on a 12-token vocabulary compares the first tokens' joint distribution
with the exact masked target distribution, computed from one-token passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("transformers", reason="the local engine needs transformers")
pytest.importorskip("xgrammar", reason="grammar constraints need xgrammar (extra 'local')")

from chi_squared import chi_squared_pvalue  # noqa: E402
from local_runners import require_llama_cpp  # noqa: E402
from speculative_llm import ConfigError  # noqa: E402
from speculative_llm.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from speculative_llm.engine.drafters.ngram import PromptLookupDrafter  # noqa: E402
from speculative_llm.engine.loop.engine import DraftLengthPolicy, generate_steps  # noqa: E402
from speculative_llm.engine.loop.random_stream import RandomStream  # noqa: E402
from speculative_llm.engine.loop.sampling import SamplingParams, logits_to_probs  # noqa: E402
from speculative_llm.engine.request.grammar import Constraint, GrammarVocabulary  # noqa: E402
from speculative_llm.engine.request.llama_grammar import LlamaGrammarVocabulary  # noqa: E402
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import (  # noqa: E402
    build_mini_causal_lm,
    build_tiny_llama,
    load_float32,
    perturbed_copy,
    tiny_vocabulary,
    write_gguf,
)

GREEDY = SamplingParams()

# ---- greedy, on the tiny character-level models ------------------------------------------

CHARACTERS = tiny_vocabulary()
DIGITS_THEN_WORD = r"[0-9]{3}-(cat|dog|cow)( [0-9]{2})*"
"""A regular expression the tiny models' greedy output can follow for a while."""


@pytest.fixture(scope="module", params=["transformers", "llamacpp"])
def tiny(
    request: pytest.FixtureRequest, tiny_model_dir: Path
) -> tuple[Any, Any, GrammarVocabulary]:
    """(target runner, draft runner, grammar vocabulary) on the character vocabulary."""
    encoded = [b"" if t in ("<unk>", "<s>", "</s>") else t.encode() for t in CHARACTERS]
    vocabulary = GrammarVocabulary(encoded, len(CHARACTERS), [CHARACTERS["</s>"]])
    if request.param == "llamacpp":
        require_llama_cpp()
        from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel

        target: Path = request.getfixturevalue("tiny_gguf")
        draft: Path = request.getfixturevalue("tiny_draft_gguf")
        target_model = LlamaCppModel(target, threads=1)
        return target_model.new_runner(), LlamaCppModel(draft, threads=1).new_runner(), vocabulary
    draft_dir: Path = request.getfixturevalue("tiny_draft_dir")
    return (
        TransformersRunner(load_float32(tiny_model_dir)),
        TransformersRunner(load_float32(draft_dir)),
        vocabulary,
    )


def _generate(
    runner: Any,
    drafter: Any,
    compiled: Any,
    vocabulary: GrammarVocabulary,
    k: int,
    *,
    params: SamplingParams = GREEDY,
    tokens: int = 40,
    generator: Any = None,
) -> tuple[list[Any], Constraint]:
    constraint = Constraint(compiled, vocabulary, k + 1)
    prompt = [CHARACTERS["<s>"], *(CHARACTERS[c] for c in "id 123-cat 45 67; id 123-")]
    steps = list(
        generate_steps(
            runner,
            drafter,
            prompt,
            max_new_tokens=tokens,
            params=params,
            draft_length=DraftLengthPolicy(k),
            eos_token_ids=frozenset({CHARACTERS["</s>"]}),
            generator=generator,
            constraint=constraint,
        )
    )
    return steps, constraint


def _text(steps: list[Any]) -> str:
    by_id = {index: token for token, index in CHARACTERS.items()}
    return "".join(by_id[t] for step in steps for t in step.tokens if by_id[t] != "</s>")


def test_constrained_speculation_equals_constrained_decoding(tiny: Any) -> None:
    target, draft, vocabulary = tiny
    compiled = vocabulary.regex(DIGITS_THEN_WORD)
    baseline, _ = _generate(target, None, compiled, vocabulary, 0)
    expected = [t for step in baseline for t in step.tokens]
    assert re.fullmatch(r"[0-9]{3}-(cat|dog|cow)( [0-9]{2})* ?[0-9]?", _text(baseline))
    for drafter, k in (
        (PromptLookupDrafter(1, 3), 4),
        (DraftModelDrafter(draft, len(CHARACTERS)), 3),
    ):
        steps, constraint = _generate(target, drafter, compiled, vocabulary, k)
        assert [t for step in steps for t in step.tokens] == expected
        if isinstance(drafter, PromptLookupDrafter):
            # The prompt's own "; id" text is drafted and forbidden: cut before verifying.
            assert constraint.cut_tokens > 0
        else:
            # A draft close to the target, drafting from its masked distribution.
            assert sum(step.num_accepted for step in steps) > 0


def test_a_drafted_special_token_is_cut_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """Prompt lookup drafts template tokens; the matcher must not be offered one (it warns)."""
    encoded = [b"" if t in ("<unk>", "<s>", "</s>") else t.encode() for t in CHARACTERS]
    vocabulary = GrammarVocabulary(encoded, len(CHARACTERS), [CHARACTERS["</s>"]])
    constraint = Constraint(vocabulary.regex(DIGITS_THEN_WORD), vocabulary, 4)
    capfd.readouterr()
    draft = [CHARACTERS["1"], CHARACTERS["<s>"], CHARACTERS["2"]]
    assert constraint.cut(draft) == 1
    assert constraint.cut_tokens == 2
    assert "cannot accept" not in capfd.readouterr().err


def test_a_grammar_that_completes_stops_the_generation(tiny: Any) -> None:
    target, _, vocabulary = tiny
    compiled = vocabulary.regex(r"[0-9]{3}-(cat|dog|cow)")
    steps, constraint = _generate(target, PromptLookupDrafter(1, 3), compiled, vocabulary, 4)
    assert steps[-1].finish_reason == "stop"
    assert re.fullmatch(r"[0-9]{3}-(cat|dog|cow)", _text(steps))
    assert constraint.finished


def test_running_out_of_tokens_leaves_a_prefix_of_the_grammar(tiny: Any) -> None:
    target, _, vocabulary = tiny
    compiled = vocabulary.json_schema(
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    )
    steps, constraint = _generate(
        target, PromptLookupDrafter(1, 3), compiled, vocabulary, 4, tokens=12
    )
    assert steps[-1].finish_reason == "length"
    assert re.sub(r"\s", "", _text(steps)).startswith('{"name":')
    assert not constraint.complete


# ---- bad grammars --------------------------------------------------------------------------


def test_bad_schemas_are_config_errors_that_say_what_to_change() -> None:
    vocabulary = GrammarVocabulary([b"a", b"b", b""], 3, [2])
    with pytest.raises(ConfigError, match="not valid JSON") as caught:
        vocabulary.json_schema("{not json")
    assert caught.value.field == "response_format"
    with pytest.raises(ConfigError, match="cannot be turned into a grammar"):
        vocabulary.json_schema({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}})
    with pytest.raises(ConfigError, match="regular expression"):
        vocabulary.regex("(unclosed")


def test_a_schema_xgrammar_refuses_is_one_line_with_its_reason_and_the_hint() -> None:
    """xgrammar prefixes a time and a C++ source location and ends with a newline, which
    the playground's one-line summary cut before the hint."""
    vocabulary = GrammarVocabulary([b"a", b"b", b""], 3, [2])
    with pytest.raises(ConfigError) as caught:
        vocabulary.json_schema({"type": "object", "properties": {"x": {"type": "strin"}}})
    message = str(caught.value)
    assert "\n" not in message
    assert 'Unsupported type "strin"' in message and "Simplify the schema" in message
    assert ".cc:" not in message and not re.search(r"\[\d\d:\d\d:\d\d\]", message)


# ---- sampling: chi-squared on a 12-token vocabulary ---------------------------------------

VOCAB = 12
SMALL = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate("abcdefghi")}}
PROMPT = [1, 5, 7, 3, 5, 7]
PARAMS = SamplingParams(temperature=1.0, top_k=8)
K = 2
NEW_TOKENS = K + 2
# Positions 1-2 from {a..e}, position 3 from {c..h}; never complete within 4 tokens.
EBNF = "root ::= [a-e] [a-e] [c-h] [a-i] [a-i]+"
ALLOWED = (range(3, 8), range(3, 8), range(5, 11))


@dataclass(frozen=True)
class Case:
    target: Any
    draft: Any
    vocabulary: GrammarVocabulary | LlamaGrammarVocabulary
    exact: npt.NDArray[np.float32]


def masked_distribution(runner: Any) -> npt.NDArray[np.float32]:
    """P(x1, x2, x3) of the masked target under PARAMS, from one-token passes."""

    def probs(logits: npt.NDArray[np.float32], allowed: range) -> npt.NDArray[np.float32]:
        masked = np.full_like(logits, -np.inf)
        masked[list(allowed)] = logits[list(allowed)]
        return logits_to_probs(masked, PARAMS)

    runner.reset()
    first = probs(runner.forward(PROMPT, 1)[0].copy(), ALLOWED[0])
    joint = np.zeros((VOCAB, VOCAB, VOCAB), dtype=np.float32)
    for x1 in ALLOWED[0]:
        runner.crop(len(PROMPT))
        second = probs(runner.forward([x1], 1)[0].copy(), ALLOWED[1])
        for x2 in ALLOWED[1]:
            runner.crop(len(PROMPT) + 1)
            third = probs(runner.forward([x2], 1)[0].copy(), ALLOWED[2])
            joint[x1, x2] = first[x1] * second[x2] * third
    return joint


@pytest.fixture(scope="module", params=["transformers", "llamacpp", "llamacpp-gbnf"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    encoded = [b"", b"", b"", *(c.encode() for c in "abcdefghi")]
    vocabulary = GrammarVocabulary(encoded, VOCAB, [2])
    # Soft weights: each position's distribution spreads over several tokens.
    model = build_tiny_llama(VOCAB, seed=5, hidden_size=64, init_std=0.12, attention_scale=1.0)
    draft = perturbed_copy(model, noise=0.6, seed=4)
    if request.param.startswith("llamacpp"):
        require_llama_cpp()
        from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel

        directory = tmp_path_factory.mktemp("grammar-gguf")
        paths = [
            write_gguf(directory / f"{name}.gguf", weights, SMALL, quantization="Q8_0")
            for name, weights in (("target", model), ("draft", draft))
        ]
        target = LlamaCppModel(paths[0], threads=1)
        runners = (target.new_runner(), LlamaCppModel(paths[1], threads=1).new_runner())
        reference = target.new_runner()
        if request.param == "llamacpp-gbnf":
            # llama.cpp's own grammar sampler: what a [local] install without xgrammar runs.
            vocabulary = LlamaGrammarVocabulary.for_tokenizer(target.tokenizer, VOCAB)
    else:
        # The one-layer LM of the unconstrained sampling test: thousands of generations
        # in seconds.
        model = build_mini_causal_lm(VOCAB, seed=5)
        draft = perturbed_copy(model, noise=0.2, seed=4)
        runners = (TransformersRunner(model), TransformersRunner(draft))
        reference = TransformersRunner(model)
    assert (runners[0].max_verify_tokens or K + 1) >= K + 1  # otherwise nothing is drafted
    return Case(runners[0], runners[1], vocabulary, masked_distribution(reference))


def _first_row_only(mask: Any) -> Any:
    def masked(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        mask(logits[:1])
        return logits

    return masked


def _sample(
    case: Case, drafter: Any, trials: int, *, break_mask: bool = False
) -> list[tuple[int, ...]]:
    generator = RandomStream(2024)
    compiled = case.vocabulary.ebnf(EBNF)
    samples = []
    for _ in range(trials):
        constraint = case.vocabulary.constraint(compiled, K + 1)
        if break_mask:
            # WRONG on purpose: mask only the first verified row.
            constraint.mask = _first_row_only(constraint.mask)  # type: ignore[method-assign]
        tokens: list[int] = []
        try:
            for step in generate_steps(
                case.target,
                drafter,
                PROMPT,
                max_new_tokens=NEW_TOKENS,
                params=PARAMS,
                draft_length=DraftLengthPolicy(K),
                generator=generator,
                constraint=constraint,
            ):
                tokens.extend(step.tokens)
        except RuntimeError:
            # A broken mask lets through a token the grammar refuses to follow.
            tokens.extend([0] * (NEW_TOKENS - len(tokens)))
        samples.append(tuple(tokens))
    return samples


def _pvalue(
    samples: list[tuple[int, ...]], first: int, second: int, expected: npt.NDArray[np.float32]
) -> float:
    counts = np.zeros((VOCAB, VOCAB), dtype=np.float32)
    for sample in samples:
        counts[sample[first], sample[second]] += 1
    return chi_squared_pvalue(counts.flatten().tolist(), expected.flatten().tolist())


def test_constrained_sampling_matches_the_masked_target(case: Case) -> None:
    for drafter, trials in (
        (DraftModelDrafter(case.draft, VOCAB), 900),
        (PromptLookupDrafter(1, 2), 600),
    ):
        samples = _sample(case, drafter, trials)
        assert all(
            sample[i] in ALLOWED[i] for sample in samples for i in range(3)
        )  # the grammar holds
        assert _pvalue(samples, 0, 1, case.exact.sum(axis=2)) > 1e-3
        assert _pvalue(samples, 1, 2, case.exact.sum(axis=0)) > 1e-3


def test_the_constrained_test_catches_an_unmasked_row(case: Case) -> None:
    samples = _sample(case, DraftModelDrafter(case.draft, VOCAB), 300, break_mask=True)
    assert _pvalue(samples, 1, 2, case.exact.sum(axis=0)) < 1e-6
