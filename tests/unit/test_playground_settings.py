"""Run settings (validation, timing mode, request) and the preset prompts."""

from __future__ import annotations

import json

import pytest

from speculative_llm.errors import ConfigError
from speculative_playground.presets import CATEGORIES, PRESETS, find_preset, preset_names
from speculative_playground.settings import RunSettings


def test_defaults_run_the_packaged_model_with_prompt_lookup() -> None:
    settings = RunSettings()
    spec = settings.spec_config()
    assert settings.backend == "local" and settings.model == "smollm2-135m"
    assert spec is not None and spec.method == "ngram" and spec.num_speculative_tokens == 12
    # The local engine drafts only what pays for its verification (k: the longest draft).
    assert spec.is_cost_aware
    # One machine, two engines taking turns step by step: fair and visibly a race.
    assert settings.timing_mode() == "interleaved"
    managed = RunSettings(backend="managed").spec_config()
    assert managed is not None and not managed.cost_aware  # servers choose for themselves


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"backend": "cloud"}, "backend"),
        ({"method": "eagle"}, "method"),
        ({"method": "draft_model"}, "draft_model"),
        ({"k": 0}, "k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"timing": "later"}, "timing"),
        ({"backend": "managed", "timing": "interleaved"}, "timing"),
        ({"runs": 0}, "runs"),
        ({"runs": 11}, "runs"),
        ({"model": " "}, "model"),
        ({"json_schema": '{"type": "object",'}, "json_schema"),
        ({"json_schema": '["not", "an", "object"]'}, "json_schema"),
        ({"backend": "url", "method": "server"}, "server_url"),
        (
            {"backend": "url", "method": "server", "server_kind": "x", "server_url": "http://h"},
            "server_kind",
        ),
    ],
)
def test_invalid_settings_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunSettings(**changes)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_draft_model_only_used_by_its_method() -> None:
    assert RunSettings(draft_model="smollm2-135m").draft_model_used is None
    with_draft = RunSettings(method="draft_model", draft_model="smollm2-135m")
    spec = with_draft.spec_config()
    assert spec is not None and spec.draft_model == "smollm2-135m"


def test_server_method_keeps_the_servers_configuration() -> None:
    settings = RunSettings(backend="url", method="server", server_url="http://h:1")
    assert settings.spec_config() is None
    assert settings.describe_backend() == "llamacpp @ h:1"


@pytest.mark.parametrize(
    ("baseline_url", "expected"),
    [("", "fair"), ("http://h:2", "fair"), ("http://other:1", "concurrent")],
)
def test_auto_timing_of_servers_is_fair_on_one_machine(baseline_url: str, expected: str) -> None:
    settings = RunSettings(
        backend="url", method="server", server_url="http://h:1", baseline_url=baseline_url
    )
    assert settings.timing_mode() == expected
    assert RunSettings(timing="concurrent").timing_mode() == "concurrent"


def test_request_carries_the_prompt_and_limits() -> None:
    request = RunSettings(max_tokens=32, temperature=0.7, seed=3).request("Hello")
    assert request.messages is not None and request.messages[0].content == "Hello"
    assert (request.max_tokens, request.temperature, request.seed) == (32, 0.7, 3)
    assert request.model is None
    url = RunSettings(backend="url", method="server", server_url="http://h:1", model="qwen")
    assert url.request("Hi").model == "qwen"
    # Neither side starts from what the other left in a shared local engine's cache.
    assert request.extra == {"cache_prompt": False}
    assert url.request("Hi").extra == {}
    with pytest.raises(ConfigError, match="prompt"):
        RunSettings().request("   ")


def test_url_description_hides_credentials() -> None:
    settings = RunSettings(
        backend="url", method="server", server_url="http://user:pw@h:1", api_key="sk-1"
    )
    assert "pw" not in settings.describe_backend()
    assert "sk-1" not in repr(settings)


def test_presets_cover_every_category() -> None:
    assert set(CATEGORIES) == {
        "Code edit",
        "Summarisation",
        "Extraction / RAG",
        "QA",
        "Translation",
        "Math",
        "Chat",
        "Structured output",
        "Agent loop",
    }
    assert len({p.name for p in PRESETS}) == len(PRESETS)
    for category in CATEGORIES:
        names = preset_names(category)
        assert names and all(find_preset(n).category == category for n in names)
    assert preset_names() == [p.name for p in PRESETS]


def test_code_edit_presets_quote_what_the_answer_copies() -> None:
    # Prompt lookup only pays off when the prompt holds long spans of the answer.
    for preset in PRESETS:
        if preset.category in ("Code edit", "Extraction / RAG"):
            assert len(preset.prompt) > 400


def test_a_json_schema_constrains_both_sides_requests() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    request = RunSettings(json_schema=json.dumps(schema)).request("Extract the id")
    assert request.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "playground", "schema": schema},
    }
    # No schema, or only blanks: free text.
    assert RunSettings(json_schema="  \n").request("Hi").response_format is None


def test_an_invalid_schema_says_where_and_how_to_get_free_text() -> None:
    with pytest.raises(ConfigError, match=r"not valid JSON: .* line 1, column \d+.*clear the box"):
        RunSettings(json_schema='{"type": "object",')


def test_structured_presets_carry_a_schema_of_an_object() -> None:
    structured = [p for p in PRESETS if p.schema]
    kinds = ("Structured output", "Agent loop")
    assert structured and all(p.category in kinds for p in structured)
    for preset in structured:
        schema = RunSettings(json_schema=preset.schema).schema()
        assert schema is not None and schema["type"] == "object"
        # Every key required: the grammar forces the whole object.
        assert set(schema["required"]) == set(schema["properties"])
        # The values are quoted from the prompt: what prompt lookup drafts.
        assert len(preset.prompt) > 400
    assert all(not p.schema for p in PRESETS if p.category not in kinds)


def test_agent_loop_presets_share_one_tool_call_shape() -> None:
    steps = preset_names("Agent loop")
    assert len(steps) >= 2
    assert len({find_preset(name).schema for name in steps}) == 1  # the global trie's pattern
    spec = RunSettings(method="suffix").spec_config()
    assert spec is not None and spec.method == "suffix" and spec.cost_aware
    with pytest.raises(ConfigError, match="does not run on the Managed llama-server"):
        RunSettings(backend="managed", method="suffix")


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="Unknown preset"):
        find_preset("nope")
