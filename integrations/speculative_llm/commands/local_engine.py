"""The options of the in-process engine, shared by the commands that run it.

``generate``, ``bench`` and ``playground`` all load models into the local engine, so
they take the same ``--runner``, ``--device``, ``--dtype``, ``--threads`` and ``--exact``
and pass them on under the ``LocalBackend`` option names.
"""

from __future__ import annotations

import argparse
from typing import Any

from speculative_llm.config import EXACT_POLICIES

__all__ = ["add_local_engine_arguments", "local_engine_options"]

_THREADS_HELP = "CPU threads of the local engine (llama.cpp's or torch's; default: their choice)"


def add_local_engine_arguments(
    parser: argparse.ArgumentParser, *, threads_help: str = _THREADS_HELP
) -> None:
    """Add ``--runner``, ``--device``, ``--dtype``, ``--threads`` and ``--exact``.

    Args:
        parser: The sub-command's parser.
        threads_help: Help of ``--threads``, for a command whose threads reach more than
            the local engine.
    """
    parser.add_argument(
        "--runner",
        choices=("auto", "llamacpp", "transformers"),
        default="auto",
        help="local engine runner: auto (default: llama.cpp for .gguf files and packaged "
        "models, transformers for Hugging Face ids and directories), llamacpp or transformers",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device of in-process transformers models (default cpu)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        help="weights of in-process transformers models: auto (default; float32 on a CPU), "
        "float32, bfloat16 or float16",
    )
    parser.add_argument("--threads", type=int, help=threads_help)
    parser.add_argument(
        "--exact",
        choices=EXACT_POLICIES,
        default="distribution",
        help="exactness of the local engine: distribution (default: every pass on every "
        "thread, as plain llama.cpp; output distributed exactly as the target's, greedy text "
        "may part from the baseline only at a near-tie) or bitwise (greedy output "
        "token-identical to the baseline, slower past llama.cpp's split-KV length)",
    )


def local_engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed local engine arguments, keyed by their ``LocalBackend`` option names."""
    return {
        "runner": args.runner,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "exact": args.exact,
    }
