"""Benchmark options, their validation and the CLI's parsing of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from speculative_llm.bench.contenders import spec_for
from speculative_llm.bench.options import QUICK, BenchOptions, parse_ks, parse_methods
from speculative_llm.bench.records import OURS, Variant
from speculative_llm.cli import build_parser
from speculative_llm.commands.bench import options_from_args
from speculative_llm.errors import ConfigError


def test_parse_methods_and_ks() -> None:
    assert parse_methods("none, ngram,ngram,draft_model") == ("none", "ngram", "draft_model")
    assert parse_ks("3,5,8,5") == (3, 5, 8)
    with pytest.raises(ConfigError, match=r"Unknown benchmark method.*medusa"):
        parse_methods("none,medusa")
    with pytest.raises(ConfigError, match=r"integers >= 1.*'0'"):
        parse_ks("3,0")
    with pytest.raises(ConfigError, match=r"integers >= 1.*'x'"):
        parse_ks("x")
    with pytest.raises(ConfigError, match="No draft lengths in"):
        parse_ks(" , ")


def test_variants_put_the_baseline_first_and_cross_methods_with_ks() -> None:
    options = BenchOptions(
        methods=("none", "ngram", "draft_model"),
        ks=(3, 5),
        draft_model="d",
        compare_transformers=True,
    )
    labels = [v.label for v in options.variants()]
    assert labels == [
        "none",
        "ngram k=3",
        "ngram k=5",
        "draft_model k=3",
        "draft_model k=5",
        "transformers none",
        "transformers ngram k=3",
        "transformers ngram k=5",
        "transformers draft_model k=3",
        "transformers draft_model k=5",
    ]
    server = BenchOptions(backend="vllm", base_url="http://x", methods=("none", "server"))
    assert server.variants() == [Variant(OURS, "none"), Variant(OURS, "server")]


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"methods": ("none", "draft_model")}, "needs a draft model: pass --draft"),
        ({"methods": ("none", "server")}, "server's own configuration"),
        ({"base_url": "http://x"}, "for server backends"),
        ({"backend": "vllm"}, "needs --base-url"),
        ({"repeats": 0}, "repeats must be an integer >= 1"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"ks": (0,)}, "Draft lengths"),
        ({"per_category": 0}, "per_category"),
        ({"methods": ("none", "eagle")}, "Unknown benchmark method"),
        (
            {"backend": "vllm", "base_url": "http://x", "compare_transformers": True},
            "--compare-transformers loads the model",
        ),
    ],
)
def test_invalid_options_say_what_to_do(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        BenchOptions(**changes)  # type: ignore[arg-type]


def test_llamacpp_without_url_starts_its_own_servers() -> None:
    assert BenchOptions(backend="llamacpp").managed_servers
    assert not BenchOptions(backend="llamacpp", base_url="http://x").managed_servers
    assert not BenchOptions().managed_servers


def _parse(*argv: str) -> BenchOptions:
    args = build_parser().parse_args(["bench", *argv])
    options: BenchOptions = options_from_args(args)
    return options


def test_cli_quick_fills_unset_options_and_explicit_ones_win() -> None:
    quick = _parse("--quick")
    assert (quick.per_category, quick.max_tokens, quick.repeats) == (
        QUICK["per_category"],
        QUICK["max_tokens"],
        QUICK["repeats"],
    )
    explicit = _parse("--quick", "--repeats", "5", "--max-tokens", "20")
    assert (explicit.repeats, explicit.max_tokens, explicit.per_category) == (5, 20, 1)
    full = _parse()
    assert (full.per_category, full.repeats, full.max_tokens) == (None, 3, 128)


def test_cli_always_adds_the_baseline_and_parses_lists() -> None:
    options = _parse(
        "--methods",
        "ngram,draft_model",
        "--draft",
        "smollm2-135m",
        "--k",
        "3,8",
        "--categories",
        "rag,code_edit",
        "--prompts",
        "p.jsonl",
        "--no-warmup",
        "--threads",
        "2",
    )
    assert options.methods == ("none", "ngram", "draft_model")
    assert options.ks == (3, 8)
    assert options.categories == "rag,code_edit"
    assert options.prompts_file == Path("p.jsonl")
    assert options.warmup is False
    assert options.threads == 2


def test_to_dict_is_json_ready() -> None:
    record = BenchOptions(prompts_file=Path("x.jsonl"), categories=("qa",)).to_dict()
    assert record["prompts_file"] == "x.jsonl"
    assert record["categories"] == ["qa"]
    assert record["methods"] == ["none", "ngram"]


def test_llama_server_variants_follow_the_ngram_types_and_ks() -> None:
    options = BenchOptions(ks=(3, 8), compare_llama_server=True)
    servers = [v for v in options.variants() if v.engine == "llama-server"]
    assert [v.label for v in servers] == [
        "llama-server none",
        "llama-server ngram-simple k=3",
        "llama-server ngram-simple k=8",
        "llama-server ngram-mod k=3",
        "llama-server ngram-mod k=8",
    ]
    with pytest.raises(ConfigError, match="--backend llamacpp") as caught:
        BenchOptions(backend="vllm", base_url="http://x", compare_llama_server=True)
    assert caught.value.field == "compare_llama_server"
    with pytest.raises(ConfigError, match="ngram-simple"):
        BenchOptions(compare_llama_server=True, llama_server_types=("draft-simple",))
    with pytest.raises(ConfigError, match="Unknown runner"):
        BenchOptions(runner="onnx")


def test_suffix_decoding_is_a_local_bench_method() -> None:
    options = BenchOptions(methods=parse_methods("none,suffix"), ks=(4,), cost_aware=True)
    suffix = [v for v in options.variants() if v.method == "suffix"]
    assert suffix == [Variant(OURS, "suffix", 4)]
    spec = spec_for(suffix[0], None, cost_aware=True)
    assert spec is not None and spec.method == "suffix" and spec.num_speculative_tokens == 4
