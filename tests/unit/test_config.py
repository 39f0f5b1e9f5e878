import pytest

from speculative_llm import ConfigError, SpecConfig


def test_defaults_are_cost_aware_ngram_up_to_twelve_tokens() -> None:
    config = SpecConfig()
    assert config.method == "ngram"
    assert config.num_speculative_tokens is None and config.draft_length == 12
    assert config.is_cost_aware
    assert config.speculative


def test_baseline_is_not_speculative() -> None:
    assert not SpecConfig.baseline().speculative
    # k is irrelevant for the baseline, so 0 is accepted there
    assert SpecConfig(method="none", num_speculative_tokens=0).method == "none"


def test_unknown_method_names_the_field_and_suggests() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'ngram'") as caught:
        SpecConfig(method="ngarm")  # type: ignore[arg-type]
    assert caught.value.field == "method"


@pytest.mark.parametrize("k", [0, -3])
def test_k_below_one_with_a_speculative_method(k: int) -> None:
    with pytest.raises(ConfigError, match="num_speculative_tokens must be >= 1") as caught:
        SpecConfig(method="ngram", num_speculative_tokens=k)
    assert caught.value.field == "num_speculative_tokens"
    assert "method='none'" in str(caught.value)


def test_non_integer_k() -> None:
    with pytest.raises(ConfigError, match="must be an integer"):
        SpecConfig(num_speculative_tokens=2.5)  # type: ignore[arg-type]


def test_draft_model_method_needs_a_draft() -> None:
    with pytest.raises(ConfigError, match="needs draft_model") as caught:
        SpecConfig(method="draft_model")
    assert "method='ngram'" in str(caught.value)


def test_ngram_bounds() -> None:
    with pytest.raises(ConfigError, match="ngram_min"):
        SpecConfig(ngram_min=0)
    with pytest.raises(ConfigError, match="ngram_max"):
        SpecConfig(ngram_min=3, ngram_max=2)


def test_adaptive_bounds() -> None:
    with pytest.raises(ConfigError, match="must lie within"):
        SpecConfig(adaptive=True, num_speculative_tokens=20, max_speculative_tokens=8)
    with pytest.raises(ConfigError, match="min_speculative_tokens <= max_speculative_tokens"):
        SpecConfig(min_speculative_tokens=5, max_speculative_tokens=2)


def test_from_value_accepts_dict_str_config_and_none() -> None:
    assert SpecConfig.from_value(None) is None
    config = SpecConfig(method="ngram", num_speculative_tokens=3)
    assert SpecConfig.from_value(config) is config
    assert SpecConfig.from_value("none") == SpecConfig.baseline()
    assert SpecConfig.from_value({"method": "ngram", "k": 7}) == SpecConfig(
        num_speculative_tokens=7
    )
    assert SpecConfig.from_value({"method": "draft_model", "draft": "x"}) == SpecConfig(
        method="draft_model", draft_model="x"
    )


def test_from_value_rejects_unknown_keys_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'num_speculative_tokens'"):
        SpecConfig.from_value({"num_speculative_token": 3})
    with pytest.raises(ConfigError, match="must be a SpecConfig, a dict or a method name"):
        SpecConfig.from_value(5)  # type: ignore[arg-type]


def test_replace_validates_again_and_round_trips() -> None:
    config = SpecConfig()
    with pytest.raises(ConfigError):
        config.replace(num_speculative_tokens=0)
    assert SpecConfig(**config.to_dict()) == config
