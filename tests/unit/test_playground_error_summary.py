"""What the page shows about errors: status and a short reason, never what servers sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_runners import require_llama_cpp
from speculative_llm.errors import (
    BackendHTTPError,
    BackendUnavailableError,
    ConfigError,
    EngineCrashedError,
    MalformedResponseError,
    ModelNotFoundError,
    UnsupportedMethodError,
    VocabularyMismatchError,
)
from speculative_playground.error_summary import DETAILS_IN_LOG, browser_message

BODY = "Traceback (most recent call last): internal-service secret config at /srv/app"


def test_http_errors_show_the_status_and_a_reason_not_the_body() -> None:
    error = BackendHTTPError(
        f"HTTP 500 from the server at http://127.0.0.1:9/v1/chat/completions: {BODY}",
        status_code=500,
        server_message=BODY,
        url="http://127.0.0.1:9/v1/chat/completions",
    )
    message = browser_message(error)
    assert "HTTP 500 (Internal Server Error)" in message and "127.0.0.1:9" in message
    assert "internal-service" not in message and DETAILS_IN_LOG in message
    unauthorized = BackendHTTPError("HTTP 401", status_code=401, url="http://h:1")
    assert "API key" in browser_message(unauthorized)


def test_malformed_answers_quote_nothing() -> None:
    error = MalformedResponseError(f"The response is not valid JSON; it starts with {BODY!r}")
    assert "internal-service" not in browser_message(error)


@pytest.mark.parametrize(
    "error",
    [
        ModelNotFoundError(
            'llama-server could not load a model: "gguf_init_from_file_impl: invalid magic '
            "characters: 'root', expected 'GGUF'\". Check that the .gguf file is complete and "
            "supported by this build. Log: /tmp/llama-server-x1.log\nLast log lines:\nroot:x:0:0"
        ),
        VocabularyMismatchError(
            "llama-server refused the draft model 'd.gguf' for target 't.gguf': their "
            "vocabularies differ. Server log: 'common_speculative: root'. Use a draft model "
            "with the target's tokenizer."
        ),
        BackendUnavailableError(
            "llama-server exited with code 1 while starting. Log: /tmp/llama-server-x1.log\n"
            "Last log lines:\nroot:x:0:0"
        ),
    ],
    ids=["load-failed", "vocabulary", "exited"],
)
def test_messages_quoting_server_logs_keep_their_first_sentence_only(error: Exception) -> None:
    message = browser_message(error)
    assert "root" not in message and ".log" not in message
    assert message.startswith("llama-server") and DETAILS_IN_LOG in message


def test_own_one_line_messages_are_shown_whole_and_secrets_masked() -> None:
    error = ConfigError("Choose a model.")
    assert browser_message(error) == "Choose a model."
    assert "sk-123" not in browser_message(ConfigError("bad key sk-123"), ["sk-123"])
    assert (
        browser_message(RuntimeError("boom /etc/x"))
        == f"The run failed (RuntimeError). {DETAILS_IN_LOG}"
    )


def test_an_engine_crash_is_shown_whole_and_a_quoted_log_is_cut() -> None:
    worker = EngineCrashedError(
        "The engine process died (signal 11, SIGSEGV) while generating; the next request "
        "starts a fresh one. On Intel CPUs with AMX, weight_layout='plain' avoids llama.cpp's "
        "AMX kernels.",
        signal_number=11,
        partial_text="Hel",
    )
    assert browser_message(worker) == str(worker)
    server = EngineCrashedError(
        "llama-server died (signal 11, SIGSEGV) during a request. Last log lines: "
        f"{BODY}\nmore of its log",
        signal_number=11,
        url="http://127.0.0.1:8080",
    )
    message = browser_message(server)
    assert message.startswith("llama-server died (signal 11, SIGSEGV) during a request.")
    assert "internal-service" not in message and DETAILS_IN_LOG in message


def test_a_model_that_fails_to_load_is_named_without_llama_cpp_log_lines(tmp_path: Path) -> None:
    require_llama_cpp()
    from speculative_llm.backends.local import LocalBackend

    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + b"garbage-" * 16)
    with pytest.raises(ModelNotFoundError) as caught:
        LocalBackend(str(corrupt), threads=1)
    assert "gguf_init_from_reader" in str(caught.value)  # the log keeps llama.cpp's lines
    message = browser_message(caught.value)
    assert "could not load" in message and "runner='transformers'" in message
    assert "gguf_init_from_reader" not in message and "llama_model_load" not in message
    assert DETAILS_IN_LOG in message


def test_a_method_a_backend_lacks_is_named_by_the_pages_labels() -> None:
    error = UnsupportedMethodError(
        "Backend 'vllm' does not support speculative method 'eagle'; it supports: none, "
        "server. Change the speculative method, or pick a backend that runs this one."
    )
    message = browser_message(error)
    assert message.startswith("The server (vLLM) does not run EAGLE (running servers)")
    assert "As the server was started" in message and "Speculative method" in message
    assert "'eagle'" not in message and "'vllm'" not in message and "none" not in message
