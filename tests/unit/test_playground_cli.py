"""``speculative-llm playground``: options, defaults and what reaches launch()."""

from __future__ import annotations

from typing import Any

import pytest

from speculative_llm.cli import build_parser, main
from speculative_llm.commands import playground as command
from speculative_llm.errors import ConfigError
from speculative_playground.security import AUTH_ENV


def parse(*argv: str) -> Any:
    return build_parser().parse_args(["playground", *argv])


def test_defaults_are_local_and_loopback() -> None:
    args = parse()
    assert (args.backend, args.model, args.host, args.port) == ("local", None, "127.0.0.1", 7860)
    assert not args.share and args.auth is None and not args.no_browser
    settings = command._settings(args)
    assert settings.backend == "local" and settings.model == "smollm2-135m"
    assert settings.method == "ngram"


def test_server_backend_needs_a_url() -> None:
    with pytest.raises(ConfigError, match="--url"):
        command._settings(parse("--backend", "vllm"))
    settings = command._settings(
        parse("--backend", "vllm", "--url", "http://h:8000", "--baseline-url", "http://h:8001")
    )
    assert (settings.backend, settings.server_kind, settings.method) == ("url", "vllm", "server")
    assert settings.baseline_url == "http://h:8001"
    with pytest.raises(ConfigError, match="--url"):
        command._settings(parse("--url", "http://h:1"))


def test_draft_model_selects_its_method() -> None:
    settings = command._settings(parse("--draft-model", "smollm2-135m", "--model", "/m.gguf"))
    assert settings.method == "draft_model" and settings.draft_model_used == "smollm2-135m"
    managed = command._settings(parse("--backend", "llama-server"))
    assert managed.backend == "managed"


def test_run_launches_with_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_launch(app: Any, **options: Any) -> None:
        seen["app"] = app
        seen.update(options)

    monkeypatch.setattr("speculative_playground.app.launch", fake_launch)
    monkeypatch.setenv(AUTH_ENV, "alice:pw")
    code = main(
        [
            "playground",
            "--host",
            "0.0.0.0",
            "--port",
            "7999",
            "--no-browser",
            "--model",
            "/models/custom.gguf",
        ]
    )
    assert code == 0
    policy = seen["policy"]
    assert policy.host == "0.0.0.0" and policy.auth == (("alice", "pw"),)
    assert seen["port"] == 7999 and seen["inbrowser"] is False
    assert seen["app"] is not None


def test_allowlist_flags_reach_the_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        "speculative_playground.app.launch", lambda app, **options: seen.update(options)
    )
    (tmp_path / "mine.gguf").write_bytes(b"GGUF")
    argv = ["playground", "--no-browser", "--backend", "llamacpp", "--url", "http://gpu:8080"]
    argv += ["--allow-url", "127.0.0.1:8081", "--model-dir", str(tmp_path)]
    argv += ["--allowed-host", "llm.example.com"]
    assert main(argv) == 0
    policy = seen["policy"]
    assert policy.check_server_url("http://gpu:8080")  # the operator's --url
    assert policy.check_server_url("http://127.0.0.1:8081")
    with pytest.raises(ConfigError, match="--allow-url"):
        policy.check_server_url("http://127.0.0.1:22")
    assert policy.model_files() == [str(tmp_path / "mine.gguf")]
    assert "llm.example.com" in policy.host_names()


def test_bad_options_exit_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["playground", "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    assert main(["playground", "--auth", "nocolon"]) == 2
    assert "user:password" in capsys.readouterr().err


def test_runner_and_threads_reach_the_local_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from speculative_playground import backend_pool

    pools: list[Any] = []

    class RecordingPool(backend_pool.BackendPool):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            pools.append(self)

    monkeypatch.setattr(backend_pool, "BackendPool", RecordingPool)
    monkeypatch.setattr("speculative_playground.app.launch", lambda app, **options: None)
    assert main(["playground", "--no-browser", "--runner", "transformers", "--threads", "3"]) == 0
    (pool,) = pools
    assert pool.local_options["runner"] == "transformers" and pool.local_options["threads"] == 3


def test_exact_sets_the_pages_exactness(monkeypatch: pytest.MonkeyPatch) -> None:
    from speculative_playground import backend_pool

    assert command._settings(parse()).exact == "distribution"
    assert command._settings(parse("--exact", "bitwise")).exact == "bitwise"
    pools: list[Any] = []
    apps: list[Any] = []

    class RecordingPool(backend_pool.BackendPool):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            pools.append(self)

    monkeypatch.setattr(backend_pool, "BackendPool", RecordingPool)
    monkeypatch.setattr("speculative_playground.app.launch", lambda app, **o: apps.append(app))
    assert main(["playground", "--no-browser", "--exact", "bitwise"]) == 0
    (pool,) = pools
    assert "exact" not in pool.local_options  # the page's setting decides, run by run
    (app,) = apps
    (exactness,) = [
        block for block in app.blocks.values() if getattr(block, "label", None) == "Exactness"
    ]
    assert exactness.value == "bitwise"


@pytest.mark.parametrize(
    ("flags", "factory"),
    [((), "build_backend_in_worker"), (("--in-process",), "build_backend_by_name")],
)
def test_the_local_engine_runs_in_a_worker_unless_asked_otherwise(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], factory: str
) -> None:
    from speculative_playground import backend_pool

    factories: list[Any] = []

    class RecordingPool(backend_pool.BackendPool):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            factories.append(options.get("backend_factory"))

    monkeypatch.setattr(backend_pool, "BackendPool", RecordingPool)
    monkeypatch.setattr("speculative_playground.app.launch", lambda app, **options: None)
    assert main(["playground", "--no-browser", *flags]) == 0
    assert factories == [getattr(backend_pool, factory)]


@pytest.mark.parametrize("argv", [(), ("--backend", "llama-server")])
def test_a_draft_length_of_zero_is_refused_not_replaced_by_the_default(
    argv: tuple[str, ...],
) -> None:
    with pytest.raises(ConfigError, match="Draft length k must be a whole number from 1 to 64"):
        command._settings(parse(*argv, "-k", "0"))
