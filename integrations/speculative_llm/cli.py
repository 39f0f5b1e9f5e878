"""The ``speculative-llm`` command line.

Each sub-command lives in ``speculative_llm.commands.<name>`` and exposes
``add_parser(subparsers)`` (which sets ``func`` on its parser) so this module stays
a dispatcher and optional dependencies load only for the command that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from speculative_llm.errors import SpeculativeError

__all__ = ["main"]

COMMANDS = ("generate", "playground", "serve", "bench", "models")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="speculative-llm",
        description="Speculative decoding with normalised statistics: generate, compare, "
        "serve, benchmark and explore it in a playground.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"speculative_llm.commands.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"speculative_llm.commands.{name}":
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except SpeculativeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
