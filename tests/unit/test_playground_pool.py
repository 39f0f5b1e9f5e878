"""The backend pool: the lease cache, and which backends each kind of settings gets."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, ClassVar

import pytest
from playground_fakes import Script, ScriptedBackend

from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.types import GenerationRequest
from speculative_playground.backend_pool import BackendPool, LeaseCache, managed_server_options
from speculative_playground.security import SecurityPolicy, UrlAllowlist
from speculative_playground.settings import RunSettings


def test_lease_cache_builds_each_key_once_under_concurrency() -> None:
    built: list[str] = []
    closed: list[str] = []
    cache: LeaseCache[str] = LeaseCache(2, closed.append)
    barrier = threading.Barrier(4)

    def build() -> str:
        built.append("model")
        return "model"

    def use() -> None:
        barrier.wait()
        with cache.lease("k", build) as value:
            assert value == "model"

    threads = [threading.Thread(target=use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == ["model"] and closed == []


def test_lease_cache_evicts_idle_entries_only() -> None:
    closed: list[str] = []
    cache: LeaseCache[str] = LeaseCache(1, closed.append)
    with cache.lease("a", lambda: "A"):
        with cache.lease("b", lambda: "B"):
            assert closed == []  # both in use: nothing may be closed
        assert closed == ["B"]  # over capacity, and "b" is idle now
    assert cache.keys() == ["a"]
    with cache.lease("c", lambda: "C"):
        pass
    assert closed == ["B", "A"]
    cache.close()
    assert closed == ["B", "A", "C"] and len(cache) == 0


def test_lease_cache_does_not_cache_failures() -> None:
    cache: LeaseCache[str] = LeaseCache(2, lambda value: None)

    def broken() -> str:
        raise OSError("disk on fire")

    with pytest.raises(OSError), cache.lease("k", broken):
        pass
    with cache.lease("k", lambda: "ok") as value:
        assert value == "ok"
    with pytest.raises(ConfigError):
        LeaseCache(0, lambda value: None)


class Factory:
    """Records ``create_backend`` calls and returns scripted backends."""

    def __init__(
        self, *, per_request_toggle: bool = True, methods: tuple[str, ...] = ("none", "ngram")
    ) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.per_request_toggle = per_request_toggle
        self.methods = methods

    def __call__(self, name: str, **options: Any) -> ScriptedBackend:
        self.calls.append((name, options))
        return ScriptedBackend(
            Script([[("a", "target")]]),
            per_request_toggle=self.per_request_toggle,
            methods=self.methods,
        )


def test_local_backends_are_cached_per_model_and_warmed_up() -> None:
    factory = Factory(methods=("none", "ngram", "draft_model"))
    pool = BackendPool(backend_factory=factory, local_options={"dtype": "float32"})
    settings = RunSettings(model="smollm2-135m", timing="fair")
    with pool.lease(settings) as pair:
        first = pair.speculative
        assert pair.baseline is pair.speculative and pair.shared_machine
        assert pair.baseline_spec is not None and pair.baseline_spec.method == "none"
        assert first.log.started == 2  # warm-up: one baseline, one speculative request
    with pool.lease(RunSettings(model="smollm2-135m", k=3, timing="fair")) as pair:
        assert pair.speculative is first and pair.draft_length == 3
    assert len(factory.calls) == 1
    name, options = factory.calls[0]
    assert name == "local" and options["model"] == "smollm2-135m" and options["dtype"] == "float32"
    pool.close()
    assert first.closed


def test_each_exactness_policy_loads_both_sides_with_it() -> None:
    factory = Factory()
    pool = BackendPool(backend_factory=factory, warm_up=False)
    for exact in ("distribution", "bitwise"):
        settings = RunSettings(exact=exact)  # type: ignore[arg-type]
        assert not pool.loaded(settings)
        with pool.lease(settings) as pair:  # interleaved: an engine per side
            assert pair.baseline is not pair.speculative
        assert pool.loaded(settings)
    loaded_with = [options["exact"] for _, options in factory.calls]
    assert loaded_with == ["distribution", "distribution", "bitwise", "bitwise"]
    with pool.lease(RunSettings(exact="bitwise")):  # kept: no engine loads again
        assert len(factory.calls) == 4
    # One source of the policy: the run's settings, never a pool-wide option.
    with pytest.raises(ConfigError, match="Exactness"):
        BackendPool(local_options={"exact": "bitwise"})


@pytest.mark.parametrize("timing", ["interleaved", "concurrent"])
def test_local_sides_that_overlap_get_an_engine_each(timing: str) -> None:
    factory = Factory()
    pool = BackendPool(backend_factory=factory, warm_up=False)
    with pool.lease(RunSettings(timing=timing)) as pair:  # type: ignore[arg-type]
        assert pair.baseline is not pair.speculative
    assert len(factory.calls) == 2


@pytest.mark.parametrize("backend", ["local", "managed"])
@pytest.mark.parametrize("field", ["model", "draft_model"])
def test_pool_refuses_models_it_does_not_offer_before_opening_them(
    backend: str, field: str
) -> None:
    # /etc/shadow's first bytes ("root") used to come back in llama.cpp's error, and the
    # local engine's errors told whether a path existed.
    factory = Factory()
    FakeServer.instances = []
    pool = BackendPool(backend_factory=factory, server_factory=FakeServer, warm_up=False)
    values = {"model": "smollm2-135m", "method": "draft_model", "draft_model": "smollm2-135m"}
    values[field] = "/etc/shadow"
    settings = RunSettings(backend=backend, **values)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="operator allowed"), pool.lease(settings):
        pass
    assert factory.calls == [] and FakeServer.instances == []


ALLOW_H = SecurityPolicy(url_allowlist=UrlAllowlist.parse("h"))


def test_url_backend_with_a_per_request_toggle_runs_both_sides() -> None:
    factory = Factory(methods=("none", "server"))
    pool = BackendPool(backend_factory=factory, policy=ALLOW_H)
    settings = RunSettings(
        backend="url",
        method="server",
        server_kind="llamacpp",
        server_url="http://h:1",
        api_key="sk-1",
        model="m",
    )
    with pool.lease(settings) as pair:
        assert pair.baseline is pair.speculative
        assert pair.speculative_spec is not None and pair.speculative_spec.method == "server"
        base, _ = pair.requests(GenerationRequest(prompt="x"))
        assert base.spec is not None and base.spec.method == "none"
    assert factory.calls == [
        ("llamacpp", {"base_url": "http://h:1", "model": "m", "api_key": "sk-1"})
    ]
    assert pair.speculative.closed  # HTTP backends are made per run


def test_url_backend_without_toggle_needs_a_baseline_url() -> None:
    factory = Factory(per_request_toggle=False, methods=("server",))
    policy = dataclasses.replace(ALLOW_H, default_api_key="sk-env")
    pool = BackendPool(backend_factory=factory, policy=policy)
    settings = RunSettings(
        backend="url", method="server", server_kind="vllm", server_url="http://h:1"
    )
    with pytest.raises(UnsupportedFeatureError, match="baseline URL"), pool.lease(settings):
        pass
    two = RunSettings(
        backend="url",
        method="server",
        server_kind="vllm",
        server_url="http://h:1",
        baseline_url="http://h:2",
    )
    with pool.lease(two) as pair:
        assert pair.baseline is not pair.speculative and pair.baseline_spec is None
        assert pair.shared_machine
    assert [options["base_url"] for _, options in factory.calls[1:]] == ["http://h:1", "http://h:2"]
    assert all(options["api_key"] == "sk-env" for _, options in factory.calls)


def test_url_backend_respects_the_allowlist() -> None:
    policy = SecurityPolicy(host="0.0.0.0", url_allowlist=UrlAllowlist.parse("gpu:8000"))
    factory = Factory()
    pool = BackendPool(policy=policy, backend_factory=factory)
    refused = RunSettings(backend="url", method="server", server_url="http://10.0.0.1:22")
    with pytest.raises(ConfigError, match="--allow-url"), pool.lease(refused):
        pass
    assert factory.calls == []


def test_typed_urls_are_refused_unless_the_operator_allowed_them() -> None:
    factory = Factory()
    pool = BackendPool(backend_factory=factory)  # the default: a local playground
    typed = RunSettings(backend="url", method="server", server_url="http://127.0.0.1:22")
    with pytest.raises(ConfigError, match="--allow-url"), pool.lease(typed):
        pass
    assert factory.calls == []


def test_unsupported_method_is_reported_before_running() -> None:
    factory = Factory(methods=("none", "server"))
    pool = BackendPool(backend_factory=factory, policy=ALLOW_H)
    settings = RunSettings(backend="url", method="eagle3", server_url="http://h:1")
    with pool.lease(settings) as pair, pytest.raises(UnsupportedFeatureError, match="eagle3"):
        pair.requests(GenerationRequest(prompt="x"))


class FakeServer:
    """Stands in for servers.LlamaServer."""

    instances: ClassVar[list[FakeServer]] = []

    def __init__(self, model: str, **options: Any) -> None:
        self.model, self.options = model, options
        self.started = self.stopped = False
        self.toggle = True
        self.backends: list[ScriptedBackend] = []  # every one handed out, in order
        FakeServer.instances.append(self)

    def start(self) -> FakeServer:
        self.started = True
        return self

    def stop(self) -> None:
        self.stopped = True

    def backend(self) -> ScriptedBackend:
        backend = ScriptedBackend(Script([[("a", "target")]]), per_request_toggle=self.toggle)
        self.backends.append(backend)
        return backend


def test_managed_llama_server_is_started_once_and_stopped_on_close() -> None:
    FakeServer.instances = []
    pool = BackendPool(server_factory=FakeServer)
    settings = RunSettings(backend="managed", model="smollm2-135m", k=4)
    for _ in range(2):
        with pool.lease(settings) as pair:
            assert pair.baseline is pair.speculative
    assert len(FakeServer.instances) == 1
    server = FakeServer.instances[0]
    assert pair.draft_length == 4  # llama-server does not report k: the app chose it
    assert pair.engine is not None and "draft length up to 4" in pair.engine
    # The lookup length is LlamaServer's default (the engine's), not set here.
    assert server.started and server.options == {
        "spec_type": "ngram-simple",
        "draft_max": 4,
        **managed_server_options(),
    }
    # The machine's threads, and no busy-waiting while the other server runs.
    assert server.options["extra_args"] == ("--poll", "0") and server.options["threads"] >= 1
    pool.close()
    assert server.stopped


class PlainServer(FakeServer):
    """A llama-server that cannot switch speculation off per request."""

    def __init__(self, model: str, **options: Any) -> None:
        super().__init__(model, **options)
        self.toggle = False


@pytest.mark.parametrize("factory", [FakeServer, PlainServer])
def test_a_managed_server_is_warmed_up_before_its_first_comparison(
    factory: type[FakeServer],
) -> None:
    # Its first run measured x5.15 at 0.7 tokens/s (issue 34): the warm-up was in it.
    FakeServer.instances = []
    pool = BackendPool(server_factory=factory)
    settings = RunSettings(backend="managed", model="smollm2-135m", k=4)
    for _ in range(2):
        with pool.lease(settings):
            pass
    assert len(FakeServer.instances) == (1 if factory is FakeServer else 2)
    for server in FakeServer.instances:
        first, second = server.backends
        warm_ups = [request.max_tokens for request in first.log.requests]
        assert warm_ups and all(tokens is not None and tokens <= 4 for tokens in warm_ups)
        assert second.log.requests == []  # once per server, not per comparison
    pool.close()


def test_managed_draft_model_sets_the_draft_length() -> None:
    FakeServer.instances = []
    pool = BackendPool(server_factory=FakeServer, offered_models=["smollm2-135m", "tiny"])
    settings = RunSettings(
        backend="managed", model="smollm2-135m", method="draft_model", draft_model="tiny", k=3
    )
    with pool.lease(settings):
        pass
    (server,) = FakeServer.instances
    assert server.options == {
        "draft_model": "tiny",
        "spec_type": "draft-simple",
        "draft_max": 3,
        **managed_server_options(),
    }
    pool.close()
