"""The HTTP layer's pure parts: URLs, retries, Retry-After, server error bodies.

How the fixtures are used: see backend_parsing.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from backend_parsing import URL

from fakeserver import fixture_bytes
from speculative_llm import (
    BackendHTTPError,
    ConfigError,
    ModelNotLoadedError,
)
from speculative_llm.backends.engines.llamacpp import (
    LlamaCppBackend,
)
from speculative_llm.backends.http import (
    EngineHints,
    Redactor,
    RetryPolicy,
    error_for_status,
    extract_server_message,
    parse_retry_after,
    redact,
    redact_headers,
    redact_url,
    split_base_url,
    split_credentials,
    validate_base_url,
)
from speculative_llm.backends.http.errors import describe_seconds, not_a_stream_error
from speculative_llm.backends.openai_compat import (
    OpenAICompatibleBackend,
)

# ---- URL, retries, errors ----


@pytest.mark.parametrize(
    ("url", "normalised"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
        ("  http://localhost:1234  ", "http://localhost:1234"),
    ],
)
def test_valid_base_urls_are_normalised(url: str, normalised: str) -> None:
    assert validate_base_url(url) == normalised


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("localhost:8080", "http://"),
        ("ftp://host:21", "http:// or https://"),
        ("http://", "no host"),
        ("http://host:99999", "invalid port"),
        ("http://host:8080/v1?key=1", "query"),
        ("", "as a string"),
        (8080, "as a string"),
    ],
)
def test_invalid_base_urls_raise_config_error_naming_the_fix(url: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        validate_base_url(url)
    assert info.value.field == "base_url"


def test_split_base_url_separates_root_and_openai_prefix() -> None:
    assert split_base_url("http://h:8080") == ("http://h:8080", "/v1")
    assert split_base_url("http://h:8080/v1") == ("http://h:8080", "/v1")
    assert split_base_url("https://h/openai") == ("https://h/openai", "")


def test_backend_paths_follow_the_base_url_prefix() -> None:
    assert OpenAICompatibleBackend("http://h:1/v1").transport.url("/v1/chat/completions") == (
        "http://h:1/v1/chat/completions"
    )
    assert OpenAICompatibleBackend("https://h/openai").transport.url("/v1/models") == (
        "https://h/openai/models"
    )
    # Native llama-server endpoints live at the root even when base_url ends in /v1.
    assert LlamaCppBackend("http://h:8080/v1").transport.url("/completion") == (
        "http://h:8080/completion"
    )


def test_retry_policy_backs_off_exponentially_and_stops() -> None:
    policy = RetryPolicy(max_retries=3, backoff_s=0.5, max_backoff_s=1.5)
    delays = [policy.delay(n) for n in range(4)]
    assert delays[:3] == [0.5, 1.0, 1.5]
    assert delays[3] is None


def test_retry_policy_honours_retry_after_within_its_cap() -> None:
    policy = RetryPolicy(max_retries=2, max_retry_after_s=10)
    assert policy.delay(0, retry_after_s=3.0) == 3.0
    assert policy.delay(0, retry_after_s=30.0) is None


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_retry_policy_rejects_bad_counts(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_retries"):
        RetryPolicy(max_retries=bad)


def test_parse_retry_after_seconds_dates_and_garbage() -> None:
    now = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
    in_five = format_datetime(now + timedelta(seconds=5), usegmt=True)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(in_five, now=now) == pytest.approx(5.0)
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("-3") == 0.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "bad top_k", "type": "invalid_request_error"}}', "bad top_k"),
        (b'{"error": "Model is overloaded", "error_type": "overloaded"}', "Model is overloaded"),
        (b'{"object": "error", "message": "no such model"}', "no such model"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b"<html>502 Bad Gateway</html>", "<html>502 Bad Gateway</html>"),
    ],
)
def test_server_messages_are_extracted_from_every_shape(body: bytes, message: str) -> None:
    assert extract_server_message(body) == message


@pytest.mark.parametrize(
    "relative",
    [
        "openai/error_model_not_found.json",
        "vllm/error_model_not_found.json",
        "lmstudio/error_model_not_found.json",
    ],
)
def test_missing_model_errors_become_model_not_loaded(relative: str) -> None:
    error = error_for_status(
        404, fixture_bytes(relative), url=URL, hints=EngineHints("X"), model="m1"
    )
    assert isinstance(error, ModelNotLoadedError)
    assert "'m1'" in str(error) and "/v1/models" in str(error)


def test_http_errors_carry_status_server_message_and_advice() -> None:
    hints = EngineHints("TGI")
    error = error_for_status(422, fixture_bytes("tgi/error_validation.json"), url=URL, hints=hints)
    assert isinstance(error, BackendHTTPError)
    assert error.status_code == 422
    assert error.server_message is not None and "top_p" in error.server_message
    assert "TGI" in str(error)
    unauthorized = error_for_status(
        401, b'{"error": {"message": "Invalid API Key"}}', url=URL, hints=hints
    )
    assert isinstance(unauthorized, BackendHTTPError) and "api_key" in str(unauthorized)


# ---- redaction: URL credentials, API keys, Authorization headers ----


def test_redact_masks_secrets_url_credentials_and_header_values() -> None:
    text = (
        "POST http://admin:hunter2@h:1/v1 failed: invalid key sk-live-1234 "
        '{"Authorization": "Bearer tok-5678"} x-api-key: k-9999'
    )
    masked = redact(text, ["sk-live-1234", None, ""])
    for secret in ("hunter2", "sk-live-1234", "tok-5678", "k-9999"):
        assert secret not in masked
    assert "http://***@h:1/v1" in masked
    assert redact_url("https://a:b@host/x") == "https://***@host/x"
    assert redact_url("https://host/x") == "https://host/x"
    assert redact_headers({"Authorization": "Bearer x", "Accept": "*/*"}) == {
        "Authorization": "***",
        "Accept": "*/*",
    }


def test_short_secrets_are_masked_only_where_they_stand_alone() -> None:
    assert redact("key=ab; table", ["ab"]) == "key=***; table"


def test_split_credentials_decodes_percent_escapes() -> None:
    assert split_credentials("http://admin:p%40ss@127.0.0.1:8080/v1") == (
        "http://127.0.0.1:8080/v1",
        ("admin", "p@ss"),
    )
    assert split_credentials("http://127.0.0.1:8080") == ("http://127.0.0.1:8080", None)


def test_redactor_masks_the_basic_auth_encoding_and_error_attributes() -> None:
    redactor = Redactor(["sk-abcd"], credentials=("admin", "hunter2"))
    error = BackendHTTPError(
        "HTTP 401: got Basic YWRtaW46aHVudGVyMg== and sk-abcd",
        status_code=401,
        server_message="echo YWRtaW46aHVudGVyMg== sk-abcd",
    )
    redactor.error(error)
    assert "YWRtaW46aHVudGVyMg==" not in str(error) and "sk-abcd" not in str(error)
    assert error.server_message is not None and "sk-abcd" not in error.server_message


def test_url_credentials_leave_base_url_and_every_repr() -> None:
    backend = OpenAICompatibleBackend("http://admin:hunter2@127.0.0.1:8080/v1")
    assert backend.base_url == "http://127.0.0.1:8080/v1"
    assert backend.transport.url("/v1/models") == "http://127.0.0.1:8080/v1/models"
    for text in (repr(backend), repr(backend.transport), backend.model_name):
        assert "hunter2" not in text and "admin" not in text


def test_url_credentials_and_api_key_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="only one of them") as info:
        OpenAICompatibleBackend("http://admin:hunter2@h:1", api_key="sk-x")
    assert "hunter2" not in str(info.value)


def test_invalid_url_errors_mask_its_credentials() -> None:
    with pytest.raises(ConfigError) as info:
        validate_base_url("http://admin:hunter2@h:1/v1?x=1")
    assert "hunter2" not in str(info.value) and "***@h:1" in str(info.value)


def test_the_default_timeout_suits_an_interactive_client() -> None:
    # A silent server used to block a caller for ten minutes (600 s) by default.
    assert OpenAICompatibleBackend("http://h:1").transport.read_timeout <= 120.0
    assert OpenAICompatibleBackend("http://h:1", timeout=900).transport.read_timeout == 900.0


def test_not_a_stream_names_web_pages_and_json_but_lets_lax_servers_through() -> None:
    hints = EngineHints("llama-server")
    page = not_a_stream_error("text/html", b"<html>hi", url=URL, hints=hints, status=200)
    assert page is not None and "'text/html'" in str(page) and "<html>hi" in str(page)
    for lax in ("text/event-stream; charset=utf-8", "text/plain", None):
        assert not_a_stream_error(lax, b"data: {}", url=URL, hints=hints, status=200) is None


def test_durations_are_described_for_people() -> None:
    assert describe_seconds(3600) == "3600 s (1 h)"
    assert describe_seconds(90) == "90 s (1.5 min)"
    assert describe_seconds(5) == "5 s"
