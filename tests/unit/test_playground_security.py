"""Deployment policy: bind address, credentials, URL allowlist, model list, redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from speculative_llm.errors import ConfigError
from speculative_playground.security import (
    ALLOWLIST_ENV,
    API_KEY_ENV,
    AUTH_ENV,
    AllowlistEntry,
    SecurityPolicy,
    UrlAllowlist,
    is_loopback_host,
    parse_auth,
    redact,
    redact_url,
    remove_dot_segments,
)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("192.168.1.10", False),
        ("example.com", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_parse_auth_keeps_colons_in_passwords() -> None:
    assert parse_auth("alice:s3:cr:et") == (("alice", "s3:cr:et"),)
    assert parse_auth("a:1, b:2") == (("a", "1"), ("b", "2"))


@pytest.mark.parametrize("value", ["alice", ":pw", "alice:", " , "])
def test_parse_auth_rejects_malformed_credentials(value: str) -> None:
    with pytest.raises(ConfigError, match="user:password"):
        parse_auth(value)


def test_parse_auth_error_does_not_echo_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_auth("alice:secret, bob")
    assert "secret" not in str(caught.value)


def test_default_policy_is_local_and_opens_only_what_the_operator_allowed() -> None:
    policy = SecurityPolicy()
    assert policy.host == "127.0.0.1" and policy.local_only
    assert not policy.custom_urls_allowed and not policy.custom_models_allowed
    assert policy.exposure_warnings() == []
    # Even on loopback: a typed URL could reach any local service, a path any file.
    with pytest.raises(ConfigError, match="--allow-url"):
        policy.check_server_url("  http://10.0.0.5:8000 ")
    assert policy.check_model("smollm2-135m", ["smollm2-135m"]) == "smollm2-135m"
    with pytest.raises(ConfigError, match="--model-dir"):
        policy.check_model("/etc/shadow", ["smollm2-135m"])


def test_a_refused_path_says_the_same_whether_it_exists_or_not(tmp_path: Path) -> None:
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"root")
    messages = []
    for path in (existing, tmp_path / "missing.gguf"):
        with pytest.raises(ConfigError) as caught:
            SecurityPolicy().check_model(str(path), ["smollm2-135m"])
        messages.append(str(caught.value).replace(path.name, "NAME"))
    assert messages[0] == messages[1]


def test_model_dirs_allow_the_files_under_them_only(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "hf-model").mkdir(parents=True)
    (models / "hf-model" / "config.json").write_text("{}")
    (models / "small.gguf").write_bytes(b"GGUF")
    (models / "notes.txt").write_text("not a model")
    outside = tmp_path / "secret.gguf"
    outside.write_bytes(b"root")
    (models / "link.gguf").symlink_to(outside)
    policy = SecurityPolicy.from_options(model_dirs=[str(models)], environ={})
    assert policy.custom_models_allowed
    small = str(models / "small.gguf")
    assert policy.check_model(small, []) == small
    assert policy.check_model(str(models / "hf-model"), []) == str(models / "hf-model")
    for refused in (
        str(outside),
        str(models / "link.gguf"),  # a link out of the directory
        str(models / ".." / "secret.gguf"),
        "/etc/shadow",
    ):
        with pytest.raises(ConfigError, match="operator allowed"):
            policy.check_model(refused, [])
    assert policy.model_files() == [str(models / "hf-model"), small]
    with pytest.raises(ConfigError, match="not a directory"):
        SecurityPolicy.from_options(model_dirs=[str(models / "small.gguf")], environ={})


def test_share_link_makes_the_app_exposed() -> None:
    policy = SecurityPolicy(share=True)
    assert not policy.local_only
    with pytest.raises(ConfigError, match=ALLOWLIST_ENV):
        policy.check_server_url("http://127.0.0.1:8080")


def test_exposed_app_without_a_login_is_warned_about() -> None:
    policy = SecurityPolicy(host="0.0.0.0")
    with pytest.raises(ConfigError, match="operator allowed"):
        policy.check_server_url("http://169.254.169.254/latest")
    assert any(AUTH_ENV in w for w in policy.exposure_warnings())


def test_allowlist_opens_only_listed_servers() -> None:
    allowlist = UrlAllowlist.parse("gpu-box:8000, https://llm.example.com/v1, *.lab.example")
    policy = SecurityPolicy(host="0.0.0.0", auth=(("u", "p"),), url_allowlist=allowlist)
    assert policy.custom_urls_allowed
    assert policy.check_server_url("http://gpu-box:8000") == "http://gpu-box:8000"
    assert policy.check_server_url("https://llm.example.com/v1/chat")
    assert policy.check_server_url("http://node3.lab.example:9000")
    for refused in (
        "http://gpu-box:8001",  # other port
        "http://llm.example.com/v1",  # http, entry says https
        "https://llm.example.com/v2",  # other path
        "http://lab.example.evil.com",
        "http://127.0.0.1:8080",
    ):
        with pytest.raises(ConfigError, match="--allow-url"):
            policy.check_server_url(refused)
    assert policy.exposure_warnings() == []


def test_allowlist_from_flags_and_operator_urls() -> None:
    policy = SecurityPolicy.from_options(allow_urls=["127.0.0.1:8080"], environ={})
    assert policy.check_server_url("http://127.0.0.1:8080/")
    with pytest.raises(ConfigError, match="not one of them"):
        policy.check_server_url("http://127.0.0.1:9999")
    wider = policy.allowing_urls(["http://127.0.0.1:9999"])
    assert wider.check_server_url("http://127.0.0.1:9999")
    assert SecurityPolicy().allowing_urls([]) == SecurityPolicy()


def test_allowlist_entry_forms() -> None:
    assert AllowlistEntry.parse("Box:81") == AllowlistEntry(host="box", port=81)
    assert AllowlistEntry.parse("https://a.b/x/") == AllowlistEntry(
        host="a.b", scheme="https", path_prefix="/x"
    )
    for bad in ("ftp://a.b", "http://", "a.b:notaport", "http://a.b/?q=1"):
        with pytest.raises(ConfigError, match="allowlist"):
            AllowlistEntry.parse(bad)
    with pytest.raises(ConfigError, match="names no server"):
        UrlAllowlist.parse(" , ")


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8080", "file:///etc/passwd", "http://", "http://h:99999"]
)
def test_malformed_urls_are_rejected(url: str) -> None:
    with pytest.raises(ConfigError, match="server URL"):
        SecurityPolicy().check_server_url(url)


def test_from_options_reads_the_environment() -> None:
    env = {AUTH_ENV: "admin:pw", ALLOWLIST_ENV: "box:1", API_KEY_ENV: "sk-env"}
    policy = SecurityPolicy.from_options(host="0.0.0.0", environ=env)
    assert policy.auth == (("admin", "pw"),)
    assert policy.url_allowlist is not None and policy.url_allowlist.allows("http://box:1")
    assert policy.default_api_key == "sk-env"
    assert "sk-env" not in repr(policy)
    explicit = SecurityPolicy.from_options(auth="other:pw2", environ=env)
    assert explicit.auth == (("other", "pw2"),)
    assert SecurityPolicy.from_options(environ={}).auth == ()


def test_redaction_masks_keys_and_url_credentials() -> None:
    message = "POST http://user:hunter2@h:1/v1 failed with key sk-123"
    masked = redact(message, ["sk-123", None])
    assert "hunter2" not in masked and "sk-123" not in masked
    assert "http://***@h:1/v1" in masked
    assert redact_url("https://a:b@host/x") == "https://***@host/x"
    assert redact_url("https://host/x") == "https://host/x"
    assert SecurityPolicy(default_api_key="sk-env").secrets("sk-typed", "") == (
        "sk-env",
        "sk-typed",
    )


def test_dot_segments_cannot_leave_an_allowed_path() -> None:
    policy = SecurityPolicy.from_options(allow_urls=["http://127.0.0.1:18102/v1"], environ={})
    assert policy.check_server_url("http://127.0.0.1:18102/v1/./x/..") == (
        "http://127.0.0.1:18102/v1/"
    )
    for escaping in ("http://127.0.0.1:18102/v1/../admin", "http://127.0.0.1:18102/v1/x/../../a"):
        with pytest.raises(ConfigError, match="not one of them") as caught:
            policy.check_server_url(escaping)
        assert "/admin" in str(caught.value) or "/a'" in str(caught.value)
    for hidden in (
        "http://127.0.0.1:18102/v1/%2e%2e/admin",
        "http://127.0.0.1:18102/v1/%2E./admin",
        "http://127.0.0.1:18102/v1%2f..%2fadmin",
        "http://127.0.0.1:18102/v1/..%5cadmin",
        "http://127.0.0.1:18102/v1\\..\\admin",
    ):
        with pytest.raises(ConfigError, match="backslash or an encoded"):
            policy.check_server_url(hidden)


@pytest.mark.parametrize(
    ("path", "resolved"),
    [("/a/b/c/./../../g", "/a/g"), ("mid/content=5/../6", "mid/6"), ("/..", "/"), ("/a/.", "/a/")],
)
def test_remove_dot_segments_follows_rfc_3986(path: str, resolved: str) -> None:
    assert remove_dot_segments(path) == resolved
