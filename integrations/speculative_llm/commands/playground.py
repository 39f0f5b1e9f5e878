"""``speculative-llm playground``: open the side-by-side playground in the browser.

The page's settings start from the options given here (backend, model, method...);
the user can change them in the page. The app listens on 127.0.0.1 unless
``--host`` or ``--share`` say otherwise, and opens only the models and servers the
operator allowed: the packaged models, ``--model``/``--draft-model``, model files under
``--model-dir`` and the servers of ``--url``/``--baseline-url``/``--allow-url``.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from speculative_llm.backends.registry import SERVER_BACKENDS
from speculative_llm.commands.local_engine import add_local_engine_arguments, local_engine_options
from speculative_llm.config import (
    DEFAULT_FIXED_DRAFT,
    DEFAULT_LONGEST_DRAFT,
    METHODS,
    local_methods,
)
from speculative_llm.errors import ConfigError, MissingDependencyError
from speculative_llm.shutdown import on_termination

__all__ = ["add_arguments", "run"]

# A running server of each kind is reached with --url; llama-server names the one the
# app starts itself (the managed backend), not the llamacpp alias.
_URL_KINDS = SERVER_BACKENDS
_BACKENDS = ("local", "llama-server", *_URL_KINDS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``speculative-llm playground``."""
    parser.add_argument(
        "--backend",
        choices=_BACKENDS,
        default="local",
        help="initial backend: local (the embedded engine, in a worker process; default), "
        "llama-server (started by the app) or the kind of a running server reached with --url",
    )
    parser.add_argument(
        "--model",
        "-m",
        default=None,
        help="target model (default smollm2-135m; for a --url server: the served model name)",
    )
    parser.add_argument("--draft-model", help="draft model with the target's vocabulary")
    parser.add_argument(
        "--method",
        # Every method but the baseline (the playground runs it on the other side).
        choices=tuple(dict.fromkeys(m for m in (*METHODS, *local_methods()) if m != "none")),
        default=None,
        help="speculative method (default: ngram, or server with --url)",
    )
    parser.add_argument(
        "-k",
        type=int,
        help="draft length: the longest draft of the local engine's cost-aware drafting "
        f"(default {DEFAULT_LONGEST_DRAFT}), a server's fixed draft length (default "
        f"{DEFAULT_FIXED_DRAFT})",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per side (default 128)")
    parser.add_argument("--url", help="URL of a running server (with a server --backend)")
    parser.add_argument(
        "--baseline-url", help="URL of a second server without speculation, for the baseline"
    )
    add_local_engine_arguments(parser)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the local engine in the app's own process instead of a worker process "
        "(a native crash in the engine then stops the app)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument(
        "--share", action="store_true", help="also open a public Gradio share link (opt-in)"
    )
    parser.add_argument(
        "--auth",
        help="require a login, as user:password (default: $SPECULATIVE_PLAYGROUND_AUTH)",
    )
    parser.add_argument(
        "--allow-url",
        action="append",
        default=[],
        metavar="URL",
        help="a server the page may call (repeatable): http://host:port, host:port, or host "
        "for any port there (default: only --url and --baseline-url)",
    )
    parser.add_argument(
        "--model-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory whose model files the page may load (repeatable; default: only "
        "the packaged models and --model/--draft-model)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name the app is reached by, e.g. behind a proxy (repeatable; requests "
        "naming other hosts are refused)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="comparisons run at once (default 1: honest timings; others queue)",
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")


def _settings(args: argparse.Namespace) -> Any:
    from speculative_playground.settings import DEFAULT_MODEL, RunSettings, default_draft_length

    if args.backend in _URL_KINDS:
        if not args.url:
            raise ConfigError(
                f"--backend {args.backend} talks to a running server: give its address with "
                "--url (for example --url http://127.0.0.1:8080).",
                field="url",
            )
        return RunSettings(
            backend="url",
            server_kind=args.backend,
            server_url=args.url,
            baseline_url=args.baseline_url or "",
            model=args.model or "",
            draft_model=args.draft_model,
            method=args.method or "server",
            k=default_draft_length("url") if args.k is None else args.k,
            max_tokens=args.max_tokens,
            exact=args.exact,
        )
    if args.url or args.baseline_url:
        raise ConfigError(
            "--url and --baseline-url go with the kind of a running server: "
            f"--backend {{{','.join(_URL_KINDS)}}}.",
            field="url",
        )
    managed = args.backend == "llama-server"
    return RunSettings(
        backend="managed" if managed else "local",
        model=args.model or DEFAULT_MODEL,
        draft_model=args.draft_model,
        method=args.method or ("draft_model" if args.draft_model else "ngram"),
        k=default_draft_length("managed" if managed else "local") if args.k is None else args.k,
        max_tokens=args.max_tokens,
        exact=args.exact,
    )


def run(args: argparse.Namespace) -> int:
    """Build and serve the playground until interrupted; returns the exit code."""
    try:
        import gradio  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError("gradio", "playground", "The playground") from error
    from speculative_playground import build_app, launch
    from speculative_playground.backend_pool import (
        BackendPool,
        build_backend_by_name,
        build_backend_in_worker,
    )
    from speculative_playground.runner import WORKER_THREAD_PREFIX, CancelRegistry
    from speculative_playground.security import SecurityPolicy
    from speculative_playground.settings import PACKAGED_MODELS, model_choices

    if args.concurrency < 1:
        raise ConfigError(
            f"--concurrency must be >= 1, got {args.concurrency}.", field="concurrency"
        )
    settings = _settings(args)
    policy = SecurityPolicy.from_options(
        host=args.host,
        share=args.share,
        auth=args.auth,
        allow_urls=args.allow_url,
        model_dirs=args.model_dir,
        allowed_hosts=args.allowed_host,
    )
    # The servers the operator named are allowed; typed ones must be on the allowlist.
    policy = policy.allowing_urls([u for u in (settings.server_url, settings.baseline_url) if u])
    chosen = (settings.model, settings.draft_model) if settings.backend != "url" else ()
    custom = [name for name in chosen if name and name not in PACKAGED_MODELS]
    # The operator's, the packaged ones, the user's own stores', then --model-dir's.
    models = list(dict.fromkeys([*model_choices(*custom), *policy.model_files()]))
    # --exact is the page's initial Exactness (in the settings): each run loads its
    # engines with the policy chosen there.
    local_options = local_engine_options(args)
    del local_options["exact"]
    pool = BackendPool(
        policy=policy,
        offered_models=models,
        local_options=local_options,
        backend_factory=build_backend_by_name if args.in_process else build_backend_in_worker,
    )
    registry = CancelRegistry()
    app = build_app(
        policy=policy,
        pool=pool,
        models=models,
        defaults=settings,
        concurrency_limit=args.concurrency,
        registry=registry,
    )
    try:
        # SIGTERM stops the running generations at once, not only the web server: the
        # process exits within a container platform's grace period.
        with on_termination(lambda: _stop_now(app, registry)):
            launch(app, policy=policy, port=args.port, inbrowser=not args.no_browser)
    finally:
        # Cancelled workers stop after their current step; let them, before the models go
        # (an interpreter torn down under a running llama.cpp decode crashes).
        _join_workers(WORKER_THREAD_PREFIX, timeout_s=_WORKERS_GRACE_S)
        pool.close()
    return 0


def _stop_now(app: Any, registry: Any) -> None:
    """On SIGTERM: cancel every running comparison and let the web server quit at once.

    Without ``force_exit`` uvicorn waits for open connections (a page's event stream)
    until Gradio gives up after 5 s.
    """
    registry.cancel_all()
    server = getattr(app, "server", None)
    if server is not None:
        server.force_exit = True


_WORKERS_GRACE_S = 3.0
"""Longest wait for cancelled generations to stop on the way out."""


def _join_workers(prefix: str, *, timeout_s: float) -> None:
    """Wait, at most ``timeout_s`` in all, for the threads whose name starts with ``prefix``."""
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
