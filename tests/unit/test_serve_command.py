"""``speculative-llm serve``: the printed command lines and argument errors (no server runs)."""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import pytest

from speculative_llm.cli import main
from speculative_llm.commands.serve import method_for_engine
from speculative_llm.errors import ConfigError

HELP_2026 = Path(__file__).parent.parent / "fixtures" / "llama_server" / "help_b11434.txt"


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    """Prints the captured b11434 ``--help`` (the serve command only reads its flags)."""
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\ncat '{HELP_2026}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    model = tmp_path / "target.gguf"
    model.write_bytes(b"GGUF")
    return model


def printed_command(capsys: pytest.CaptureFixture[str]) -> list[str]:
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    return shlex.split(lines[0])


def test_llamacpp_print_only_follows_the_binary(
    fake_binary: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "serve",
            "--model",
            str(model_file),
            "--binary",
            str(fake_binary),
            "--print-only",
            "-k",
            "8",
            "--port",
            "9001",
        ]
    )
    assert code == 0
    command = printed_command(capsys)
    assert command[0] == str(fake_binary)
    assert command[command.index("--spec-type") + 1] == "ngram-simple"  # the default
    assert command[command.index("--spec-ngram-simple-size-m") + 1] == "8"
    # The local engine's lookup length, not llama-server's 12 (which rarely matches).
    assert command[command.index("--spec-ngram-simple-size-n") + 1] == "3"
    assert command[command.index("--port") + 1] == "9001"


def test_llamacpp_ngram_size_option(
    fake_binary: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["serve", "--model", str(model_file), "--binary", str(fake_binary), "--print-only"]
    assert main([*common, "--ngram-size", "5"]) == 0
    command = printed_command(capsys)
    assert command[command.index("--spec-ngram-simple-size-n") + 1] == "5"
    assert main([*common, "--draft", str(model_file)]) == 0
    assert "--spec-ngram-simple-size-n" not in printed_command(capsys)
    assert main([*common, "--draft", str(model_file), "--ngram-size", "5"]) != 0
    assert "--ngram-size applies to n-gram" in capsys.readouterr().err


def test_llamacpp_print_only_with_a_draft_and_extra_args(
    fake_binary: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "serve",
            "--model",
            str(model_file),
            "--draft",
            str(model_file),
            "--binary",
            str(fake_binary),
            "--print-only",
            "--",
            "--seed",
            "7",
        ]
    )
    assert code == 0
    command = printed_command(capsys)
    assert command[command.index("--spec-draft-model") + 1] == str(model_file)
    assert command[command.index("--spec-type") + 1] == "draft-simple"
    assert command[-2:] == ["--seed", "7"]


def test_llamacpp_baseline_has_no_spec_flags(
    fake_binary: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "serve",
            "--model",
            str(model_file),
            "--binary",
            str(fake_binary),
            "--print-only",
            "--spec-type",
            "none",
        ]
    )
    assert not [part for part in printed_command(capsys) if part.startswith("--spec")]


def test_vllm_prints_both_forms(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--engine", "vllm", "--model", "org/m", "-k", "3", "--print-only"])
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    serve, module = (shlex.split(line) for line in lines)
    assert serve[:3] == ["vllm", "serve", "org/m"]
    config = json.loads(serve[serve.index("--speculative-config") + 1])
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    assert serve[serve.index("--port") + 1] == "8000"
    assert module[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]


def test_vllm_draft_from_a_llama_spec_type(capsys: pytest.CaptureFixture[str]) -> None:
    main(
        [
            "serve",
            "--engine",
            "vllm",
            "--model",
            "org/big",
            "--draft",
            "org/small",
            "--spec-type",
            "draft-simple",
            "--print-only",
        ]
    )
    serve = printed_command(capsys)
    config = json.loads(serve[serve.index("--speculative-config") + 1])
    assert config["method"] == "draft_model" and config["model"] == "org/small"


def test_sglang_prints_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "serve",
            "--engine",
            "sglang",
            "--model",
            "org/m",
            "--spec-type",
            "ngram",
            "--host",
            "0.0.0.0",
        ]
    )
    assert code == 0
    command = printed_command(capsys)
    assert command[:3] == ["python", "-m", "sglang.launch_server"]
    assert command[command.index("--speculative-algorithm") + 1] == "NGRAM"
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--port") + 1] == "30000"


def test_bad_values_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engine", "sglang", "--model", "m", "-k", "0"]) == 2
    assert "-k must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm", "--model", "m", "--spec-type", "magic"]) == 2
    assert "Unknown --spec-type 'magic'" in capsys.readouterr().err
    assert main(["serve", "--engine", "sglang", "--model", "m", "--spec-type", "eagle"]) == 2
    assert "needs draft_model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec_type", "draft", "method"),
    [
        (None, None, "ngram"),
        (None, "d", "draft_model"),
        ("ngram-mod", None, "ngram"),
        ("draft-simple", "d", "draft_model"),
        ("draft-eagle3", "d", "eagle3"),
        ("draft", "d", "draft_model"),
        ("eagle", "d", "eagle"),
        ("none", None, "none"),
    ],
)
def test_method_for_engine(spec_type: str | None, draft: str | None, method: str) -> None:
    assert method_for_engine(spec_type, draft) == method


def test_method_for_engine_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match="ngram-simple"):
        method_for_engine("turbo", None)
