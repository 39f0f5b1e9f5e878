"""Backends for a comparison: loaded once, shared between sessions, closed at exit.

Loading a local model takes seconds and starting a llama-server more, so both are
cached by configuration and lent out (``lease``). An entry is closed only when it is
evicted while nobody uses it, or when the pool closes. HTTP backends for servers
reached by URL are cheap and made for each run.

Local engines run in a worker process each (``WorkerBackend``), so a native crash in
one (llama.cpp's AMX kernels on some Intel Xeons) fails that run with a message, not
the app; the next run starts a fresh worker. ``build_backend_by_name`` runs them in
the app's process instead.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from speculative_llm.backends.base import Backend
from speculative_llm.backends.builder import build_backend
from speculative_llm.backends.registry import backend_entry, resolve_backend_name
from speculative_llm.backends.worker import WorkerBackend
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.types import GenerationRequest, Message
from speculative_playground.auto_draft import auto_draft_note, pick_offered_draft
from speculative_playground.security import SecurityPolicy
from speculative_playground.settings import AUTO_DRAFT, PACKAGED_MODELS, RunSettings

__all__ = [
    "BackendPair",
    "BackendPool",
    "LeaseCache",
    "build_backend_by_name",
    "build_backend_in_worker",
    "managed_server_options",
]

_Value = TypeVar("_Value")

_LLAMA_SPEC_TYPES = {"ngram": "ngram-simple", "draft_model": "draft-simple"}


@dataclass
class _Entry(Generic[_Value]):
    value: _Value
    users: int = 0


class LeaseCache(Generic[_Value]):
    """A thread-safe cache of expensive objects lent out by key.

    Each key is built once even when several threads ask for it at the same time;
    beyond ``capacity`` entries, the least recently used idle ones are closed.

    Args:
        capacity: Idle entries kept (entries in use are never closed).
        close: Called on an entry's value when it is evicted or the cache closes.
    """

    def __init__(self, capacity: int, close: Callable[[_Value], None]) -> None:
        if capacity < 1:
            raise ConfigError(f"capacity must be >= 1, got {capacity}.", field="capacity")
        self.capacity = capacity
        self._close = close
        self._entries: OrderedDict[Hashable, _Entry[_Value]] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> list[Hashable]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    @contextmanager
    def lease(self, key: Hashable, build: Callable[[], _Value]) -> Iterator[_Value]:
        """Lend the value for ``key``, building it with ``build`` on first use.

        A failing ``build`` caches nothing and its error propagates.
        """
        entry = self._acquire(key, build)
        try:
            yield entry.value
        finally:
            with self._lock:
                entry.users -= 1
            self._evict()

    def _acquire(self, key: Hashable, build: Callable[[], _Value]) -> _Entry[_Value]:
        with self._lock:
            entry = self._take(key)
            if entry is not None:
                return entry
            builder = self._building.setdefault(key, threading.Lock())
        with builder:
            # Another thread may have finished building while this one waited.
            with self._lock:
                entry = self._take(key)
                if entry is not None:
                    return entry
            value = build()
            with self._lock:
                entry = _Entry(value, users=1)
                self._entries[key] = entry
                self._building.pop(key, None)
        self._evict()
        return entry

    def _take(self, key: Hashable) -> _Entry[_Value] | None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.users += 1
            self._entries.move_to_end(key)
        return entry

    def _evict(self) -> None:
        evicted: list[_Value] = []
        with self._lock:
            excess = len(self._entries) - self.capacity
            for key in list(self._entries):
                if excess <= 0:
                    break
                if self._entries[key].users == 0:
                    evicted.append(self._entries.pop(key).value)
                    excess -= 1
        for value in evicted:
            self._close(value)

    def close(self) -> None:
        """Close every entry (in use or not) and empty the cache."""
        with self._lock:
            values = [entry.value for entry in self._entries.values()]
            self._entries.clear()
        for value in values:
            self._close(value)


@dataclass(frozen=True, slots=True)
class BackendPair:
    """The two sides of a comparison.

    Attributes:
        baseline: Backend of the baseline side.
        speculative: Backend of the speculative side (may be the same object).
        baseline_spec: ``spec`` of the baseline request (None: the server's default).
        speculative_spec: ``spec`` of the speculative request (None: the server's).
        shared_machine: Whether both sides run on the same machine.
        draft_length: k as the app configured it (None: the server's own, unknown).
        engine: One line on how the model runs (the local engine's runner, or the server).
        draft_model: The draft model ``auto`` picked for this run (None: none picked).
        draft_note: Which draft model ``auto`` picked and why, for the run's notes.
    """

    baseline: Backend
    speculative: Backend
    baseline_spec: SpecConfig | None
    speculative_spec: SpecConfig | None
    shared_machine: bool
    draft_length: int | None = None
    engine: str | None = None
    draft_model: str | None = None
    draft_note: str | None = None

    @classmethod
    def on_one_machine(
        cls,
        baseline: Backend,
        speculative: Backend,
        speculative_spec: SpecConfig | None,
        *,
        engine: str | None = None,
    ) -> BackendPair:
        """Both sides on this machine, the baseline turning speculation off per request."""
        return cls(
            baseline=baseline,
            speculative=speculative,
            baseline_spec=SpecConfig.baseline(),
            speculative_spec=speculative_spec,
            shared_machine=True,
            draft_length=_draft_length(speculative_spec),
            engine=engine,
        )

    def requests(self, request: GenerationRequest) -> tuple[GenerationRequest, GenerationRequest]:
        """The baseline and speculative requests, checked against each backend.

        Raises:
            UnsupportedFeatureError: A backend cannot serve its side as configured.
        """
        baseline = request.replace(spec=self.baseline_spec)
        speculative = request.replace(spec=self.speculative_spec)
        self.baseline.check_request(baseline)
        self.speculative.check_request(speculative)
        return baseline, speculative


def build_backend_by_name(name: str, **options: Any) -> Backend:
    """The core's ``build_backend`` (its rules, its errors), every backend in this process."""
    return build_backend(name, options=options).backend


def build_backend_in_worker(name: str, **options: Any) -> Backend:
    """The pool's default factory: in-process engines in a worker process of their own.

    Engines that run a model here (``local``) become a ``WorkerBackend``, whose crash
    is an error of the run in flight; server backends, which run nothing native, are
    built as ``build_backend_by_name`` builds them.
    """
    entry = backend_entry(resolve_backend_name(name))
    if entry is not None and not entry.server:
        return WorkerBackend(name, options)
    return build_backend_by_name(name, **options)


def _local_key(role: str, model: str, exact: str) -> tuple[str, str, str]:
    """The cache key of a local engine: its role, target model and exactness policy."""
    return (role, model, exact)


def _close_backend(backend: Backend) -> None:
    backend.close()


def _warm_up(backend: Backend, specs: Sequence[SpecConfig | None]) -> None:
    """One tiny generation per spec, so the first measured run pays no start-up cost."""
    request = GenerationRequest(messages=(Message(role="user", content="Hi"),), max_tokens=4)
    for spec in specs:
        for _ in backend.stream(request.replace(spec=spec)):
            pass


def _draft_length(spec: SpecConfig | None) -> int | None:
    """The draft length k of a configuration (None: the server's own, or no speculation)."""
    if spec is None or not spec.speculative or spec.method == "server":
        return None
    return spec.draft_length


def _engine_line(backend: Backend) -> str | None:
    """How a backend runs its model, where it says (the local engine's runner)."""
    description = getattr(backend, "runner_description", None)
    if not isinstance(description, str):
        return None
    if isinstance(backend, WorkerBackend):
        return f"{description}; in a worker process of the playground"
    return description


class BackendPool:
    """Creates, caches and lends the backends a comparison needs.

    Args:
        policy: Deployment policy (which URLs and models users may type).
        offered_models: Models offered in the page (the only ones an exposed app loads).
        local_options: Extra ``LocalBackend`` options (``runner``, ``device``,
            ``dtype``, ``threads``). Not ``exact``: the exactness policy is a run
            setting (``RunSettings.exact``), and each policy gets its own engines.
        capacity: Idle local backends and managed servers kept loaded.
        warm_up: Run a tiny generation after loading a local backend.
        backend_factory: Builds a backend from a name and options (default
            ``build_backend_in_worker``: local engines in worker processes;
            ``build_backend_by_name`` keeps them in this process; tests pass fakes).
        server_factory: Makes a managed llama-server (default ``servers.LlamaServer``).
    """

    def __init__(
        self,
        *,
        policy: SecurityPolicy | None = None,
        offered_models: Sequence[str] = PACKAGED_MODELS,
        local_options: dict[str, Any] | None = None,
        capacity: int = 2,
        warm_up: bool = True,
        backend_factory: Callable[..., Backend] = build_backend_in_worker,
        server_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.policy = policy or SecurityPolicy()
        self.offered_models = tuple(offered_models)
        self.local_options = dict(local_options or {})
        if "exact" in self.local_options:
            raise ConfigError(
                "The exactness policy is a setting of each run (RunSettings.exact, the page's "
                "Exactness), not a pool option: leave 'exact' out of local_options.",
                field="local_options",
            )
        self.warm_up = warm_up
        self._backend_factory = backend_factory
        self._server_factory = server_factory
        self._local: LeaseCache[Backend] = LeaseCache(capacity, _close_backend)
        self._servers: LeaseCache[Any] = LeaseCache(capacity, _stop_server)
        self._warm_lock = threading.Lock()
        self._warmed: set[Hashable] = set()
        self._warm_servers: weakref.WeakSet[Any] = weakref.WeakSet()

    def loaded(self, settings: RunSettings) -> bool:
        """Whether the model (or managed server) ``settings`` needs is already up."""
        if settings.backend == "local":
            loaded = self._local.keys()
            return _local_key("local", settings.model, settings.exact) in loaded
        if settings.backend == "managed":
            started = self._servers.keys()
            return any(
                isinstance(key, tuple) and key[:2] == ("llama-server", settings.model)
                for key in started
            )
        return True

    def close(self) -> None:
        """Close every cached backend and stop every managed server."""
        self._local.close()
        self._servers.close()

    @contextmanager
    def lease(self, settings: RunSettings) -> Iterator[BackendPair]:
        """Lend the backends for ``settings`` for the duration of a comparison.

        A draft model ``auto`` is picked first, among the offered models
        (``auto_draft``); the pair names it and says why.

        Raises:
            ConfigError: A URL or model this deployment does not allow, or a server
                that cannot run the baseline without a second URL.
            VocabularyMismatchError: ``auto`` found no offered model that can draft.
            SpeculativeError: Loading the model or starting the server failed.
        """
        choice = None
        if settings.draft_model_used == AUTO_DRAFT and settings.backend != "url":
            target = self.policy.check_model(settings.model, self.offered_models)
            choice = pick_offered_draft(target, self.offered_models)
            settings = dataclasses.replace(settings, draft_model=choice.name)
        with ExitStack() as stack:
            if settings.backend == "local":
                pair = self._local_pair(settings, stack)
            elif settings.backend == "managed":
                pair = self._managed_pair(settings, stack)
            else:
                pair = self._url_pair(settings, stack)
            if choice is not None:
                pair = dataclasses.replace(
                    pair, draft_model=choice.name, draft_note=auto_draft_note(choice)
                )
            yield pair

    # ---- local engine ------------------------------------------------------------------

    def _local_pair(self, settings: RunSettings, stack: ExitStack) -> BackendPair:
        model = self.policy.check_model(settings.model, self.offered_models)
        draft = settings.draft_model_used
        if draft is not None:
            draft = self.policy.check_model(draft, self.offered_models)
        spec = settings.spec_config()
        exact = settings.exact
        # One engine per target model and exactness policy (both sides load with the
        # same one): it loads draft models itself, on first use.
        key = _local_key("local", model, exact)
        speculative = stack.enter_context(
            self._local.lease(key, lambda: self._load_local(model, exact))
        )
        self._warm(key, speculative, [SpecConfig.baseline(), spec])
        baseline = speculative
        if settings.timing_mode() in ("interleaved", "concurrent"):
            # One engine serves one stream at a time: sides that take turns or overlap
            # need an engine each (the same model, loaded twice).
            key = _local_key("local-baseline", model, exact)
            baseline = stack.enter_context(
                self._local.lease(key, lambda: self._load_local(model, exact))
            )
            self._warm(key, baseline, [SpecConfig.baseline()])
        return BackendPair.on_one_machine(
            baseline, speculative, spec, engine=_engine_line(speculative)
        )

    def _load_local(self, model: str, exact: str) -> Backend:
        return self._backend_factory(
            "local",
            model=model,
            speculative=SpecConfig(method="ngram"),
            exact=exact,
            **self.local_options,
        )

    def _warm(self, key: Hashable, backend: Backend, specs: Sequence[SpecConfig | None]) -> None:
        """Warm a backend up once per configuration (the first run would pay loading costs)."""
        if not self.warm_up:
            return
        if isinstance(backend, WorkerBackend):
            # A worker that died was replaced by a fresh one, which is cold again.
            backend.ensure_running()
        warm_key = (
            key,
            id(backend),
            backend.engine_pid if isinstance(backend, WorkerBackend) else None,
            tuple((spec.method, spec.draft_model) if spec else None for spec in specs),
        )
        with self._warm_lock:
            if warm_key in self._warmed:
                return
            _warm_up(backend, specs)
            self._warmed.add(warm_key)

    # ---- managed llama-server ------------------------------------------------------------

    def _managed_pair(self, settings: RunSettings, stack: ExitStack) -> BackendPair:
        model = self.policy.check_model(settings.model, self.offered_models)
        draft = settings.draft_model_used
        if draft is not None:
            draft = self.policy.check_model(draft, self.offered_models)
        spec_type = _LLAMA_SPEC_TYPES[settings.method]
        # For ngram-simple, draft_max becomes --spec-ngram-simple-size-m (the longest
        # n-gram draft); the lookup length is the command builder's default (3).
        length: dict[str, Any] = {"draft_max": settings.k}
        server = stack.enter_context(
            self._servers.lease(
                ("llama-server", model, draft, spec_type, settings.k),
                lambda: self._start_server(model, draft_model=draft, spec_type=spec_type, **length),
            )
        )
        speculative = server.backend()
        stack.callback(speculative.close)
        speculative_spec = _server_side_spec(speculative)
        if speculative.capabilities.per_request_toggle:
            baseline, baseline_spec = speculative, SpecConfig.baseline()
        else:
            plain = stack.enter_context(
                self._servers.lease(
                    ("llama-server", model, None, None, None), lambda: self._start_server(model)
                )
            )
            baseline = plain.backend()
            stack.callback(baseline.close)
            baseline_spec = None
        self._warm_up_servers(
            [(server, speculative, speculative_spec), (plain, baseline, baseline_spec)]
            if baseline is not speculative
            else [(server, speculative, baseline_spec), (server, speculative, speculative_spec)]
        )
        return BackendPair(
            baseline=baseline,
            speculative=speculative,
            baseline_spec=baseline_spec,
            speculative_spec=speculative_spec,
            shared_machine=True,
            # llama-server does not report k: it is the draft length the app started it with.
            draft_length=settings.k,
            engine=f"llama-server started by the playground ({spec_type}, draft length up to "
            f"{settings.k}); the baseline runs on a second server without speculation",
        )

    def _warm_up_servers(self, sides: Sequence[tuple[Any, Backend, SpecConfig | None]]) -> None:
        """One short request per side to a managed llama-server the first time it is lent.

        A new server's first request pays its warm-up (weights paged in, first passes of
        each shape): the first comparison on one measured x5.15 at 0.7 tokens/s. Warmed
        here, before the first comparison, that cost stays out of every measured run.
        """
        if not self.warm_up:
            return
        with self._warm_lock:
            fresh = [side for side in sides if side[0] not in self._warm_servers]
            for _, backend, spec in fresh:
                _warm_up(backend, [spec])
            self._warm_servers.update(server for server, _, _ in fresh)

    def _start_server(self, model: str, **options: Any) -> Any:
        factory = self._server_factory
        if factory is None:
            from speculative_llm.servers import LlamaServer

            factory = LlamaServer
        options = {**managed_server_options(), **options}
        server = factory(model, **{k: v for k, v in options.items() if v is not None})
        server.start()
        return server

    # ---- running servers -------------------------------------------------------------------

    def _url_pair(self, settings: RunSettings, stack: ExitStack) -> BackendPair:
        url = self.policy.check_server_url(settings.server_url)
        baseline_url = (
            self.policy.check_server_url(settings.baseline_url)
            if settings.baseline_url.strip()
            else None
        )
        options: dict[str, Any] = {}
        if settings.model.strip():
            options["model"] = settings.model.strip()
        api_key = settings.api_key or self.policy.default_api_key
        if api_key:
            options["api_key"] = api_key
        speculative = self._backend_factory(settings.server_kind, base_url=url, **options)
        stack.callback(speculative.close)
        speculative_spec = settings.spec_config()
        if speculative_spec is None:
            speculative_spec = _server_side_spec(speculative)
        engine = settings.describe_backend()
        if baseline_url is not None:
            baseline = self._backend_factory(settings.server_kind, base_url=baseline_url, **options)
            stack.callback(baseline.close)
            return BackendPair(
                baseline=baseline,
                speculative=speculative,
                baseline_spec=None,
                speculative_spec=speculative_spec,
                shared_machine=settings.timing_mode() == "fair",
                draft_length=_draft_length(speculative_spec),
                engine=engine,
            )
        if not speculative.capabilities.per_request_toggle:
            raise UnsupportedFeatureError(
                f"This {settings.server_kind} server cannot switch speculative decoding off for "
                "one request, so it cannot run the baseline itself. Start a second server "
                "without speculative flags and enter its URL as the baseline URL."
            )
        return BackendPair.on_one_machine(speculative, speculative, speculative_spec, engine=engine)


def managed_server_options() -> dict[str, Any]:
    """How the playground starts llama-server: the machine's threads, no spinning.

    llama-server's default thread count and its busy-wait polling (``--poll 50``) made
    the two servers of a comparison (speculative and baseline) spin against each other
    and the app on a small machine: 2.0 tokens/s against 36.8 in-process on 2 cores.
    With ``--threads`` set to what the local engine uses and ``--poll 0``, an idle
    server's threads sleep while the other side runs.
    """
    return {"threads": _machine_threads(), "extra_args": ("--poll", "0")}


def _machine_threads() -> int:
    try:  # the local engine's own rule; it is an optional extra
        from speculative_llm.engine.runners.llama_cpp.model import default_threads
    except ImportError:
        return max(1, (os.cpu_count() or 2) // 2)
    return default_threads()


def _server_side_spec(backend: Backend) -> SpecConfig | None:
    """``method="server"`` when the backend knows it, else its default (None)."""
    return SpecConfig(method="server") if "server" in backend.capabilities.methods else None


def _stop_server(server: Any) -> None:
    server.stop()
