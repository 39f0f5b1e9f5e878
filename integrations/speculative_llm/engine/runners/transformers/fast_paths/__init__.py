"""The transformers runner's fast paths: faster kernels where they leave the logits unchanged.

Four changes to how a Hugging Face model runs on a CPU, one module each, each used only
where a probe at load shows the model's own logits unchanged, and each kept because it
measurably pays (see docs/backends/local.md for the figures):

* ``linears`` (``OneDnnLinears``): the linear layers run on oneDNN's float32 kernel, on
  copies of their weights packed once in oneDNN's blocked layout;
* ``head`` (``VocabularyHead``): the decoder runs alone and the output projection of the
  positions the engine scores goes through oneDNN;
* ``attention`` (``GroupedAttention``): masked multi-token passes give PyTorch's SDPA
  kernel the grouped key/value heads as they are;
* ``cache`` (``new_cache``): full-attention cache layers append in place.

Each path module has ``NAME``, ``LABEL`` and ``try_on(model, vocab_size) -> (handle |
None, reason)``; ``selection.FastPaths.probe`` tries them all once per model. Patches
of objects that concurrent runners share (layers, configs) are applied once and undone
after their last user (``patches.CountedPatches``).
"""

from speculative_llm.engine.runners.transformers.fast_paths.attention import (
    ATTENTION_NAME,
    GroupedAttention,
    grouped_sdpa_attention,
)
from speculative_llm.engine.runners.transformers.fast_paths.cache import (
    cache_keyword,
    forward_parameters,
    growing_layer_class,
    new_cache,
)
from speculative_llm.engine.runners.transformers.fast_paths.head import VocabularyHead
from speculative_llm.engine.runners.transformers.fast_paths.linears import OneDnnLinears
from speculative_llm.engine.runners.transformers.fast_paths.onednn import (
    available_memory_bytes,
    onednn_linear,
    onednn_linear_available,
    packed_weight,
)
from speculative_llm.engine.runners.transformers.fast_paths.patches import (
    CountedPatches,
    Undo,
)
from speculative_llm.engine.runners.transformers.fast_paths.probing import (
    logits_agree,
    probe_tokens,
)
from speculative_llm.engine.runners.transformers.fast_paths.selection import (
    PATHS,
    FastPaths,
    FastPathsMode,
)

__all__ = [
    "ATTENTION_NAME",
    "PATHS",
    "CountedPatches",
    "FastPaths",
    "FastPathsMode",
    "GroupedAttention",
    "OneDnnLinears",
    "Undo",
    "VocabularyHead",
    "available_memory_bytes",
    "cache_keyword",
    "forward_parameters",
    "grouped_sdpa_attention",
    "growing_layer_class",
    "logits_agree",
    "new_cache",
    "onednn_linear",
    "onednn_linear_available",
    "packed_weight",
    "probe_tokens",
]
