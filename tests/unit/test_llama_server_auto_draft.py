"""``draft_model="auto"`` for a managed llama-server: the command line names the picked file.

No server starts: the binary is a script printing a captured ``--help``, the models are
header-only GGUFs (padded to stand for bigger files) laid out in stores built by
``model_stores``.
"""

from __future__ import annotations

import logging
import shlex
import stat
from pathlib import Path

import pytest

from gguf_headers import write_gguf_header
from model_stores import add_hf_model, add_lmstudio_model, add_ollama_model, isolate_stores
from speculative_llm.cli import main
from speculative_llm.errors import VocabularyMismatchError
from speculative_llm.servers import LlamaServer

HELP_2026 = Path(__file__).parent.parent / "fixtures" / "llama_server" / "help_b11434.txt"
TOKENS = [f"t{i}" for i in range(64)]


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "llama-server"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\ncat '{HELP_2026}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Stores holding a small and a smaller model of the target's vocabulary, and another."""
    # An empty packaged cache: only the stores built here hold candidates.
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))
    roots: dict[str, Path] = isolate_stores(monkeypatch, tmp_path / "stores")
    files = tmp_path / "files"
    add_ollama_model(
        roots["OLLAMA_MODELS"],
        "small",
        write_gguf_header(files / "small.gguf", TOKENS, padding=500),
    )
    add_hf_model(
        roots["HF_HUB_CACHE"],
        "org/Smaller-GGUF",
        {"smaller.gguf": write_gguf_header(files / "smaller.gguf", TOKENS, padding=100)},
    )
    other = [*TOKENS[:7], "x", *TOKENS[8:]]
    add_lmstudio_model(
        roots["SPECULATIVE_LLM_LMSTUDIO_MODELS"],
        "org/other",
        {"other.gguf": write_gguf_header(files / "other.gguf", other)},
    )
    return roots


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return write_gguf_header(tmp_path / "target" / "target.gguf", TOKENS, padding=10_000)


def _option(command: list[str], option: str) -> str:
    assert option in command, f"{option} missing from {command}"
    return command[command.index(option) + 1]


def test_auto_puts_the_smallest_model_with_the_vocabulary_on_the_command_line(
    binary: Path, stores: dict[str, Path], target: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="speculative_llm.servers"):
        server = LlamaServer(target, draft_model="auto", binary=binary, port=9000)
    assert server.draft_choice is not None
    assert server.draft_choice.name == "hf:org/Smaller-GGUF"
    assert server.spec_type == "draft-simple" and server.draft_model_path is not None
    assert _option(server.command, "--spec-draft-model") == str(server.draft_model_path)
    assert server.draft_model_path.name == "smaller.gguf"
    # Why: the smallest with the vocabulary; the one with another token 7 passed over.
    assert "is the smallest model on this machine" in server.draft_choice.reason
    assert "lmstudio:org/other: token 7 is 'x'" in server.draft_choice.reason
    assert f"draft_model='auto': {server.draft_choice.reason}" in caplog.text


def test_auto_with_no_model_of_the_vocabulary_is_refused_before_any_start(
    binary: Path, stores: dict[str, Path], tmp_path: Path
) -> None:
    lonely = write_gguf_header(
        tmp_path / "lonely.gguf", [f"u{i}" for i in range(64)], padding=10_000
    )
    with pytest.raises(VocabularyMismatchError, match="found no model") as caught:
        LlamaServer(lonely, draft_model="auto", binary=binary)
    message = str(caught.value)
    assert caught.value.field == "draft_model"
    assert "ollama:small:latest: token 0 is 't0', 'u0' in the target" in message
    assert "method='ngram'" in message


def _serve(binary: Path, model: Path, *extra: str) -> int:
    return main(["serve", "--model", str(model), "--binary", str(binary), *extra])


def test_serve_draft_auto_prints_the_pick_and_the_command(
    binary: Path, stores: dict[str, Path], target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _serve(binary, target, "--draft", "auto", "--print-only") == 0
    comment, line = capsys.readouterr().out.splitlines()
    assert comment.startswith("# --draft auto picked hf:org/Smaller-GGUF: ")
    assert "is the smallest model on this machine" in comment
    command = shlex.split(line)
    assert Path(_option(command, "--spec-draft-model")).name == "smaller.gguf"
    assert _option(command, "--spec-type") == "draft-simple"


def test_serve_draft_auto_refusal_is_a_clear_error(
    binary: Path, stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lonely = write_gguf_header(
        tmp_path / "lonely.gguf", [f"u{i}" for i in range(64)], padding=10_000
    )
    assert _serve(binary, lonely, "--draft", "auto", "--print-only") == 2
    assert _serve(binary, lonely, "--draft", "auto") == 2
    err = capsys.readouterr().err
    assert err.count("draft_model='auto' found no model on this machine") == 2
    assert "Traceback" not in err


def test_serve_draft_auto_is_for_llama_server_only(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--engine", "vllm", "--model", "org/m", "--draft", "auto"])
    assert code == 2
    assert "--draft auto picks a GGUF draft for llama-server" in capsys.readouterr().err
