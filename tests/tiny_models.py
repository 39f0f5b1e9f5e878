"""Tiny random Llama models with a character-level tokenizer, built locally for tests.

Nothing here touches the network: the tokenizer is made with the ``tokenizers``
library and the model is a randomly initialised ``LlamaForCausalLM``. The weights
are initialised with a large standard deviation so that the logits are far from
uniform: argmax ties (which would make greedy comparisons depend on float rounding)
are then vanishingly rare, and the models fall into repetitive loops that prompt
lookup can draft from.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_llama",
    "build_tiny_tokenizer",
    "load_float32",
    "perturbed_copy",
    "runner_with",
    "save_tiny_model",
    "tiny_vocabulary",
    "write_gguf",
]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
"""Special tokens, in id order: unknown, beginning and end of sequence."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<{{ message['role'] }}>{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
"""A minimal chat template: ``<role>content`` lines, then ``<assistant>``."""


def tiny_vocabulary(extra_characters: str = "") -> dict[str, int]:
    """Special tokens, then printable ASCII and a newline (about 100 entries)."""
    characters = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    characters += [c for c in extra_characters if c not in characters]
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *characters):
        vocab.setdefault(token, len(vocab))
    return vocab


def build_tiny_tokenizer(extra_characters: str = "") -> Any:
    """A character-level ``PreTrainedTokenizerFast`` with bos/eos and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = tiny_vocabulary(extra_characters)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per character; the decoder glues characters back without spaces.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_llama(
    vocab_size: int,
    *,
    seed: int = 0,
    hidden_size: int = 48,
    num_layers: int = 2,
    num_heads: int = 4,
    init_std: float = 0.5,
    attention_scale: float = 0.01,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` in float32, in eval mode.

    Args:
        vocab_size: Vocabulary size (the embedding and output rows).
        seed: Seed of the random weights (different seeds give different models).
        hidden_size: Width of the model.
        num_layers: Number of decoder layers.
        num_heads: Attention heads (two key/value heads when divisible, to exercise GQA).
        init_std: Standard deviation of the random weights; large values make the
            next-token distributions peaked, so greedy argmaxes are not near-tied.
        attention_scale: Factor on the attention output projections. Small values make
            the next token depend mostly on the last one, so greedy output falls into
            loops that prompt lookup can predict (about a third of n-gram drafts are
            accepted at 0.01), while the context still matters enough that a KV-cache
            bug changes the output.
        bos_token_id: Beginning-of-sequence id.
        eos_token_id: End-of-sequence id.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=2 if num_heads % 2 == 0 else num_heads,
        max_position_embeddings=2048,
        initializer_range=init_std,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, init_std)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(attention_scale)
    model.generation_config.pad_token_id = eos_token_id
    return model.eval()


def perturbed_copy(model: Any, *, noise: float, seed: int) -> Any:
    """A copy of ``model`` with Gaussian noise (``noise`` times each matrix's std) added.

    A lightly perturbed copy makes a draft model that mostly agrees with the target
    (partial acceptance), which exercises both the accept and the reject paths.
    """
    import copy

    import torch

    generator = torch.Generator().manual_seed(seed)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in clone.parameters():
            if parameter.dim() >= 2:
                # Relative noise: every matrix is perturbed in proportion to its scale.
                scale = float(parameter.std())
                parameter.add_(torch.randn(parameter.shape, generator=generator) * noise * scale)
    return clone.eval()


def save_tiny_model(
    out_dir: Path,
    *,
    seed: int = 0,
    extra_characters: str = "",
    draft_of: Path | None = None,
    noise: float = 0.05,
    **model_options: Any,
) -> Path:
    """Build and save a tiny model + tokenizer directory loadable with ``from_pretrained``.

    Args:
        out_dir: Directory to write (created).
        seed: Seed of the random weights.
        extra_characters: Characters appended to the vocabulary (a different vocabulary
            size, for vocabulary-mismatch tests).
        draft_of: When given, the saved model is a perturbed copy of the model in this
            directory (a draft that partly agrees with that target).
        noise: Standard deviation of the perturbation for ``draft_of``.
        **model_options: Passed to ``build_tiny_llama`` (``hidden_size``...).

    Returns:
        ``out_dir``.
    """
    from transformers import LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(extra_characters)
    if draft_of is not None:
        target = LlamaForCausalLM.from_pretrained(draft_of)
        model = perturbed_copy(target, noise=noise, seed=seed)
    else:
        model = build_tiny_llama(
            len(tokenizer),
            seed=seed,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **model_options,
        )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # The chat template travels in tokenizer_config.json; check it did, loudly.
    config = json.loads((out_dir / "tokenizer_config.json").read_text())
    if "chat_template" not in config and not (out_dir / "chat_template.jinja").exists():
        raise RuntimeError(f"chat template was not saved in {out_dir}")
    return out_dir


def _rope_permute(weight: Any, heads: int) -> Any:
    """Reorder query/key rows from Hugging Face's rotary layout to llama.cpp's.

    The same permutation as llama.cpp's ``convert_hf_to_gguf.py`` for Llama models:
    within each head, rows ``[x0..x(d/2-1), y0..]`` become interleaved pairs.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    path: Path,
    model: Any,
    vocabulary: dict[str, int],
    *,
    architecture: str = "llama",
    quantization: str = "F32",
    chat_template: str | None = CHAT_TEMPLATE,
) -> Path:
    """Write a Hugging Face ``LlamaForCausalLM`` as a GGUF file llama.cpp loads.

    The tensors are laid out as llama.cpp's converter lays out Llama checkpoints (rotary
    rows of queries and keys permuted), so llama.cpp computes what transformers does
    (up to float rounding). The vocabulary becomes a SentencePiece-style one: the space
    character is spelled ``▁``, special tokens are control tokens.

    Args:
        path: File to write.
        model: The model (float32).
        vocabulary: Token -> id (``tiny_vocabulary()``).
        architecture: ``general.architecture`` (another name makes a file llama.cpp
            refuses, for error tests).
        quantization: ``F32``, ``F16`` or ``Q8_0`` for the matrices (norms stay F32).
        chat_template: Stored as ``tokenizer.chat_template`` (None: no template).
    """
    import gguf
    import numpy as np

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or 10000.0))
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_tokenizer_model("llama")
    tokens = sorted(vocabulary, key=vocabulary.__getitem__)
    writer.add_token_list([token.replace(" ", "\u2581") for token in tokens])
    writer.add_token_scores([0.0] * len(tokens))
    types = {"<unk>": gguf.TokenType.UNKNOWN, "<s>": gguf.TokenType.CONTROL}
    types["</s>"] = gguf.TokenType.CONTROL
    writer.add_token_types([types.get(token, gguf.TokenType.NORMAL) for token in tokens])
    writer.add_unk_token_id(vocabulary["<unk>"])
    writer.add_bos_token_id(vocabulary["<s>"])
    writer.add_eos_token_id(vocabulary["</s>"])
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def add(name: str, tensor: Any, *, matrix: bool = True) -> None:
        array = tensor.detach().float().numpy()
        if not matrix or quantization == "F32":
            writer.add_tensor(name, array.astype(np.float32))
        elif quantization == "F16":
            writer.add_tensor(name, array.astype(np.float16))
        else:
            kind = gguf.GGMLQuantizationType[quantization]
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)

    state = model.state_dict()
    add("token_embd.weight", state["model.embed_tokens.weight"])
    for index in range(config.num_hidden_layers):
        prefix, block = f"model.layers.{index}.", f"blk.{index}."
        add(block + "attn_norm.weight", state[prefix + "input_layernorm.weight"], matrix=False)
        query = _rope_permute(state[prefix + "self_attn.q_proj.weight"], heads)
        add(block + "attn_q.weight", query)
        add(
            block + "attn_k.weight",
            _rope_permute(state[prefix + "self_attn.k_proj.weight"], kv_heads),
        )
        add(block + "attn_v.weight", state[prefix + "self_attn.v_proj.weight"])
        add(block + "attn_output.weight", state[prefix + "self_attn.o_proj.weight"])
        add(
            block + "ffn_norm.weight",
            state[prefix + "post_attention_layernorm.weight"],
            matrix=False,
        )
        add(block + "ffn_gate.weight", state[prefix + "mlp.gate_proj.weight"])
        add(block + "ffn_up.weight", state[prefix + "mlp.up_proj.weight"])
        add(block + "ffn_down.weight", state[prefix + "mlp.down_proj.weight"])
    add("output_norm.weight", state["model.norm.weight"], matrix=False)
    add("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build_mini_causal_lm(vocab_size: int, *, seed: int = 0, dim: int = 16) -> Any:
    """A one-layer causal LM with a transformers KV cache, ~20x faster per call than Llama.

    It speaks the interface the engine uses (``forward(input_ids, cache, use_cache,
    logits_to_keep)``, ``config``, ``get_output_embeddings``) and stores its keys and
    values in the ``DynamicCache`` it is given, so cropping is exercised for real. Used
    where a statistical test needs thousands of generations.
    """
    import torch
    from transformers import LlamaConfig

    class MiniCausalLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # One layer, for the DynamicCache the engine builds from the config.
            self.config = LlamaConfig(
                vocab_size=vocab_size,
                hidden_size=dim,
                num_hidden_layers=1,
                num_attention_heads=1,
                num_key_value_heads=1,
                max_position_embeddings=512,
            )
            self.embed = torch.nn.Embedding(vocab_size, dim)
            self.position = torch.nn.Embedding(512, dim)
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.head = torch.nn.Linear(dim, vocab_size)

        def get_output_embeddings(self) -> torch.nn.Linear:
            return self.head

        def forward(
            self,
            input_ids: torch.Tensor,
            cache: Any = None,
            use_cache: bool = True,
            logits_to_keep: int = 0,
        ) -> Any:
            from types import SimpleNamespace

            past = cache.get_seq_length() if cache is not None else 0
            length = input_ids.shape[1]
            positions = torch.arange(past, past + length)
            hidden = self.embed(input_ids) + self.position(positions)
            query, key, value = self.qkv(hidden).chunk(3, dim=-1)
            if cache is not None:
                key, value = cache.update(key[:, None], value[:, None], 0)
                key, value = key[:, 0], value[:, 0]
            scores = query @ key.transpose(1, 2) / dim**0.5
            future = torch.arange(key.shape[1])[None, :] > positions[:, None]
            scores = scores.masked_fill(future, float("-inf"))
            hidden = hidden + torch.softmax(scores, dim=-1) @ value
            logits = self.head(torch.tanh(hidden))
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
            return SimpleNamespace(logits=logits)

    torch.manual_seed(seed)
    model = MiniCausalLM()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.8)
    return model.eval()


def runner_with(model: Any, *paths: str) -> Any:
    """A ``TransformersRunner`` with only the named fast paths (``linears``, ``head``...)."""
    from speculative_llm.engine.runners.transformers.fast_paths import FastPaths
    from speculative_llm.engine.runners.transformers.runner import TransformersRunner

    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    return TransformersRunner(
        model, fast_paths=FastPaths.probe(model, vocab_size, only=frozenset(paths))
    )


def load_float32(model_dir: Path) -> Any:
    """The causal LM saved in ``model_dir``, in float32 and eval mode."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


DECODE_PROMPT = [1, *range(10, 40)]
"""Token ids of the prompt ``logits_along_a_decode`` starts from."""


def logits_along_a_decode(runner: Any) -> list[Any]:
    """Logits a ``TransformersRunner`` returns along a decode that takes every cache path.

    Prefill, verify passes around crops (one back to an empty cache), single steps: two
    runners that agree here agree through the engine's use of the cache.
    """
    runner.reset()
    # Cloned: a runner may return views of its own buffer, valid until its next call.
    seen = [runner.forward(DECODE_PROMPT, 1).copy()]
    seen.append(runner.forward([5, 6, 7, 8], 4).copy())
    runner.crop(runner.length - 3)
    seen.append(runner.forward([9, 10], 2).copy())
    for token in range(11, 20):
        seen.append(runner.forward([token], 1).copy())
    runner.crop(0)
    seen.append(runner.forward(DECODE_PROMPT[:5], 5).copy())
    return seen


def decode_concurrently(
    runners: list[Any], *, repeats: int = 5, reference: Any | None = None
) -> list[BaseException]:
    """Run ``logits_along_a_decode`` on each runner in a thread of its own, at once.

    Args:
        runners: ``TransformersRunner``s (typically sharing one model).
        repeats: Decodes per runner.
        reference: A runner whose decode every decode must equal exactly, or None to
            check nothing. It decodes first, alone, in a thread too: torch's intra-op
            thread count is per thread (a test may have changed the main thread's), and
            it changes how float sums are split.

    Returns:
        What the threads raised (a mismatch with the reference included); empty if none.
    """
    import threading

    import numpy as np

    def in_threads(work: Any, arguments: list[Any]) -> None:
        threads = [threading.Thread(target=work, args=(argument,)) for argument in arguments]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    expected: list[Any] = []
    if reference is not None:
        in_threads(lambda runner: expected.extend(logits_along_a_decode(runner)), [reference])
    errors: list[BaseException] = []

    def decode(runner: Any) -> None:
        try:
            for _ in range(repeats):
                seen = logits_along_a_decode(runner)
                if reference is not None:
                    for got, wanted in zip(seen, expected, strict=True):
                        if not np.array_equal(got, wanted):
                            raise AssertionError("a concurrent decode returned other logits")
        except BaseException as error:  # returned to the test, which asserts on it
            errors.append(error)

    in_threads(decode, runners)
    return errors
