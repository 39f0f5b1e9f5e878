"""Loading a model for the local engine: which runner, with which of its options.

Where a name points (packaged alias, ``.gguf`` file, directory, hub id) is decided by
``sources``; each runner's loader (``runners.registry``) says which models it runs
and checks its own options. GGUF files and packaged aliases run on the llama.cpp runner
by default; directories and hub ids, and GGUF files with ``runner="transformers"``
(dequantised by ``from_pretrained(dir, gguf_file=name)``), on the transformers runner.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from speculative_llm.config import EXACT_POLICIES
from speculative_llm.engine.models.sources import ModelSource, resolve_model
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.runners.base import LoadedModel, RunnerName
from speculative_llm.engine.runners.registry import (
    BUILTIN_RUNNERS,
    RunnerLoader,
    runner_loader,
    runner_names,
)
from speculative_llm.errors import ConfigError

__all__ = [
    "RUNNER_CHOICES",
    "RunnerChoice",
    "choose_runner",
    "load_model",
    "load_vocabulary",
]

RunnerChoice = Literal["auto", "llamacpp", "transformers"]
"""``auto``: llama.cpp for GGUF files and packaged aliases on a CPU (when its binding is
installed), transformers for everything else. Registered runners are chosen by name."""

RUNNER_CHOICES: tuple[str, ...] = ("auto", *BUILTIN_RUNNERS)
"""What ``runner=`` takes without a registered runner (the CLI's choices)."""


def choose_runner(choice: str, source: ModelSource, device: str) -> RunnerName:
    """The runner for a model: ``choice`` checked against the model, or ``auto`` decided.

    ``auto`` asks the runners in ``runner_names()`` order for the first one that runs the
    model by default (the built-in ones answer before any registered one).

    Raises:
        ConfigError: An unknown runner, or one that cannot run this model.
    """
    if choice == "auto":
        for name in runner_names():
            loader = runner_loader(name)
            if loader.runs_by_default(source, device):
                return loader.name
        raise ConfigError(
            f"No runner runs {source.name!r} on {device!r} by default: pass runner=.",
            field="runner",
        )
    loader = runner_loader(choice)
    refusal = loader.refusal(source, device)
    if refusal is not None:
        raise refusal
    return loader.name


def _option_owner(key: str) -> RunnerLoader | None:
    return next(
        (loader for loader in map(runner_loader, runner_names()) if key in loader.options), None
    )


def _own_options(loader: RunnerLoader, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options ``loader`` takes, after refusing those of other runners.

    Another runner's option at its default value asks nothing and is dropped (callers
    such as ``LocalBackend`` pass every option they know); at any other value it is a
    ``ConfigError`` naming the runner that takes it.
    """
    own: dict[str, Any] = {}
    for key, value in options.items():
        if key in loader.options:
            own[key] = value
            continue
        owner = _option_owner(key)
        if owner is None:
            known = sorted({k for n in runner_names() for k in runner_loader(n).options})
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"No runner takes the option {key!r}.{hint} Runner options: "
                f"{', '.join(known)}; every runner takes device, dtype and threads.",
                field=key,
            )
        if value == owner.options[key]:
            continue
        raise ConfigError(
            f"{key} is an option of the {owner.label} runner; the {loader.label} runner "
            f"loading {name!r} does not take it: leave it out, or use runner={owner.name!r}.",
            field=key,
        )
    return own


def load_model(
    name: str | ModelSource,
    *,
    runner: str = "auto",
    device: str = "cpu",
    dtype: str | Any = "auto",
    threads: int | None = None,
    exact: str = "distribution",
    progress: bool = True,
    **runner_options: Any,
) -> LoadedModel:
    """Load a model and its tokenizer by name (see ``sources`` for names).

    Args:
        name: Packaged alias, ``.gguf`` file, local directory or Hugging Face id, or
            where one of them resolved to (a ``ModelSource``: resolved once per
            request, the name is not resolved again).
        runner: ``auto``, ``llamacpp``, ``transformers`` or a registered runner.
        device: Torch device of the transformers runner (``cpu``, ``cuda``...).
        dtype: Transformers runner: ``auto`` (float32 on a CPU), ``float32``,
            ``bfloat16`` or ``float16`` (the llama.cpp runner keeps the file's types).
        threads: CPU threads (llama.cpp's, or torch's process-wide setting).
        exact: ``distribution`` or ``bitwise`` (see ``runners.llama_cpp.model.ExactPolicy``),
            for the runners that take it (``"exact"`` in their loader's options); the
            transformers runner is bitwise-exact under either (its fast paths are probed
            to leave the logits unchanged).
        progress: Show download progress for packaged models (when ``name`` is resolved).
        **runner_options: Options of the chosen runner, each checked by its loader:
            llama.cpp's ``context_window`` (tokens its cache holds; default the
            model's, at most 8192) and ``weight_layout`` (``auto``, ``repacked`` or
            ``plain``); transformers' ``fast_paths`` (``auto``: the faster kernels whose
            probe leaves the logits unchanged, or ``off``). Another runner's option is
            refused unless it has that runner's default value.

    Raises:
        ModelNotFoundError: The name does not resolve to a loadable model.
        MissingDependencyError: The chosen runner's dependencies are missing.
        ConfigError: An invalid option, or a runner that cannot run this model.
    """
    if exact not in EXACT_POLICIES:
        raise ConfigError(
            f"exact must be 'distribution' (output distributed as the target's, every pass "
            f"on every thread) or 'bitwise' (token-identical to the baseline), got {exact!r}.",
            field="exact",
        )
    source = _resolved(name, progress)
    loader = runner_loader(choose_runner(runner, source, str(device)))
    options = _own_options(loader, source.name, runner_options)
    if "exact" in loader.options:
        options["exact"] = exact
    return loader.load(source, device=device, dtype=dtype, threads=threads, **options)


def load_vocabulary(
    name: str | ModelSource, *, runner: RunnerName, progress: bool = True
) -> Tokenizer:
    """The tokenizer of a model without its weights (for compatibility checks).

    ``name`` is a model name, or the ``ModelSource`` it already resolved to.

    Raises:
        ModelNotFoundError: The model cannot be found or its vocabulary read.
        ConfigError: The model cannot run on ``runner``.
    """
    return runner_loader(runner).load_vocabulary(_resolved(name, progress))


def _resolved(name: str | ModelSource, progress: bool) -> ModelSource:
    """Where ``name`` loads from: resolved now, unless it already is a source."""
    if isinstance(name, ModelSource):
        return name
    return resolve_model(name, progress=progress)
