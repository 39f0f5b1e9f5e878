"""Draft-model pairings: never the target itself, never across vocabularies."""

from __future__ import annotations

from speculative_playground.pairings import draft_candidates, draft_note, model_note
from speculative_playground.settings import PACKAGED_MODELS


def test_no_packaged_model_drafts_for_another_or_for_itself() -> None:
    for target in ("smollm2-135m", "gemma3-270m"):
        assert draft_candidates(target, PACKAGED_MODELS) == ()
        note = draft_note(target, (), custom_allowed=True)
        assert f"No draft model ships for {target}" in note and "prompt lookup" in note


def test_a_packaged_model_drafts_for_its_f16_variant_not_the_other_way() -> None:
    assert draft_candidates("smollm2-135m-f16", PACKAGED_MODELS) == ("smollm2-135m",)
    assert draft_candidates("gemma3-270m-f16", PACKAGED_MODELS) == ("gemma3-270m",)
    # The F16 variant decodes one token at about half the speed: never a draft of its base.
    assert "smollm2-135m-f16" not in draft_candidates("smollm2-135m", PACKAGED_MODELS)


def test_an_f16_variant_says_what_regime_it_stands_for() -> None:
    note = model_note("smollm2-135m-f16")
    assert "0.24" in note and "AMD EPYC" in note
    assert model_note("gemma3-270m-f16") and not model_note("gemma3-270m")
    # Said once, under the target picker, not again under the draft picker.
    draft = draft_note("smollm2-135m-f16", ("smollm2-135m",), custom_allowed=False)
    assert draft.startswith("For the draft") and note not in draft


def test_operator_models_are_offered_and_checked_when_they_load() -> None:
    offered = ("/models/smollm2-360m.gguf", *PACKAGED_MODELS, "/models/smollm2-360m.gguf")
    # A custom target: every other model may pair (the engine checks the vocabulary).
    assert draft_candidates("/models/smollm2-360m.gguf", offered) == PACKAGED_MODELS
    # A packaged target: the custom model is offered, the other family is not.
    assert draft_candidates("smollm2-135m", offered) == ("/models/smollm2-360m.gguf",)
    assert draft_note("smollm2-135m", ("x",), custom_allowed=False).startswith("For the draft")


def test_an_exposed_app_does_not_suggest_typing_a_model() -> None:
    note = draft_note("gemma3-270m", (), custom_allowed=False)
    assert "type a smaller model" not in note and note.endswith("Use prompt lookup.")
