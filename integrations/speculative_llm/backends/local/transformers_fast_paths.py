"""The transformers runner's fast paths: faster kernels where they leave the logits unchanged.

Four changes to how a Hugging Face model runs on a CPU, each used only where a probe at
load shows the model's own logits unchanged, and each kept because it measurably pays
(see docs/backends/local.md for the figures):

* ``OneDnnLinears``: the linear layers run on oneDNN's float32 kernel, on copies of their
  weights packed once in oneDNN's blocked layout, so a verify pass of a few rows costs
  little more than a one-token pass (MKL's few-row kernel is slow on some processors);
* ``VocabularyHead``: the decoder runs alone and the output projection of the positions
  the engine scores goes through oneDNN (the prompt's other positions are never
  projected);
* ``GroupedAttention``: masked multi-token passes give PyTorch's SDPA kernel the grouped
  key/value heads as they are (transformers repeats them otherwise, copying the whole KV
  cache per layer per verify pass);
* ``GrowingLayer`` (``new_cache``): full-attention cache layers append in place instead
  of ``torch.cat``-copying the layer every pass.

``FastPaths.probe`` runs every probe once per model, logs which paths are on and why the
others are off, and is shared by the model's runners; ``fast_paths="off"`` runs the
model exactly as transformers does. Patches of objects that concurrent runners share
(layers, configs) are applied once and undone after their last user
(``CountedPatches``).
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Literal, TypeVar

import torch

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
    "grouped_sdpa_attention",
    "growing_layer_class",
    "logits_agree",
    "new_cache",
    "onednn_linear",
    "onednn_linear_available",
    "packed_weight",
    "probe_tokens",
]

logger = logging.getLogger(__name__)

FastPathsMode = Literal["auto", "off"]
"""``auto``: every fast path whose probe passes; ``off``: transformers' own forward."""

PATHS: frozenset[str] = frozenset({"linears", "head", "attention", "cache"})
"""The fast paths, by short name."""


# ---- Shared objects patched for a pass, counted per object ---------------------------

Target = TypeVar("Target")

Undo = Callable[[], None]
"""Restores what an ``apply`` function changed on one object."""


class CountedPatches(Generic[Target]):
    """Applies a change to shared objects once, and undoes it after its last user.

    Attributes:
        lock: Held while changes are applied or undone; code that reads or builds what
            ``apply`` installs (a packed weight cache, say) can hold it too.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # id(target) -> (passes using the change, how to undo it); an entry exists only
        # while some pass holds the target, so the id cannot be reused meanwhile.
        self._users: dict[int, tuple[int, Undo]] = {}

    def users(self, target: Target) -> int:
        """How many blocks currently hold the change on ``target``."""
        with self.lock:
            entry = self._users.get(id(target))
            return 0 if entry is None else entry[0]

    @contextmanager
    def applied(self, targets: Sequence[Target], apply: Callable[[Target], Undo]) -> Iterator[None]:
        """Hold the change on every target for the duration of the block.

        Args:
            targets: The objects to change.
            apply: Changes one object and returns how to undo it; called only for an
                object no other block holds.

        Raises:
            Whatever ``apply`` raises, after undoing the changes this call made.
        """
        with self.lock:
            held: list[Target] = []
            try:
                for target in targets:
                    self._hold(target, apply)
                    held.append(target)
            except BaseException:
                self._release(held)
                raise
        try:
            yield
        finally:
            with self.lock:
                self._release(targets)

    def _hold(self, target: Target, apply: Callable[[Target], Undo]) -> None:
        entry = self._users.get(id(target))
        if entry is None:
            self._users[id(target)] = (1, apply(target))
        else:
            self._users[id(target)] = (entry[0] + 1, entry[1])

    def _release(self, targets: Sequence[Target]) -> None:
        """End one hold on each target; the last one undoes the change. Lock held."""
        for target in targets:
            count, undo = self._users.pop(id(target))
            if count > 1:
                self._users[id(target)] = (count - 1, undo)
            else:
                undo()


# ---- oneDNN's float32 kernel for the linear layers -----------------------------------

# Token ids of the probe that checks a faster path against the model's own forward.
PROBE_LENGTH = 8
# |ours - theirs| allowed, relative to the largest logit: float32 summation order only.
RELATIVE_TOLERANCE = 1e-4


def onednn_linear_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear kernel."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and mkldnn is not None
        and hasattr(mkldnn, "_linear_pointwise")
    )


def onednn_linear(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``inputs @ weight.T + bias`` with oneDNN's float32 kernel (``F.linear``'s contract)."""
    product: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        inputs.contiguous(), weight, bias, "none", [], ""
    )
    return product


def probe_tokens(vocab_size: int, device: torch.device) -> torch.Tensor:
    """A fixed ``(1, PROBE_LENGTH)`` batch of token ids spread over the vocabulary."""
    probe = (torch.arange(1, PROBE_LENGTH + 1, device=device) * 7919) % vocab_size
    return probe.unsqueeze(0)


def logits_agree(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two logit tensors are equal up to float32 summation order."""
    if got.shape != expected.shape:
        return False
    scale = max(1.0, float(expected.abs().max()))
    return float((got.float() - expected.float()).abs().max()) <= RELATIVE_TOLERANCE * scale


# Layers routed to oneDNN, shared by every OneDnnLinears: two runners may hold the same
# model (a model drafting for itself), one per thread. Its lock also guards the packed
# weights.
_routed_layers: CountedPatches[torch.nn.Linear] = CountedPatches()

# oneDNN lays a packed weight out for this many rows. Measured on SmolLM2-135M's 210
# decoder layers (AMD EPYC, AVX2): packed for 8 rows, 6 rows cost 1.2x one row (plain
# weights: 1.7x, oneDNN reorders them on every call); packed for 1 row, 6 rows cost 1.8x.
PACKED_FOR_ROWS = 8
# Pack only while the copies take at most this share of the memory still available.
_PACKING_MEMORY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class _Packed:
    """A layer's weight in oneDNN's blocked layout, and what it was packed from."""

    source: torch.Tensor
    version: int | None
    weight: torch.Tensor


# Packed weights per layer, shared by every runner of a model and dropped with it.
_packed_weights: weakref.WeakKeyDictionary[torch.nn.Linear, _Packed] = weakref.WeakKeyDictionary()


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place modification counter (None for inference tensors)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return None


def _packing_available() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return mkldnn is not None and hasattr(mkldnn, "_reorder_linear_weight")


def packed_weight(module: torch.nn.Linear) -> torch.Tensor:
    """The layer's weight packed for oneDNN, packed again if the weight changed since."""
    with _routed_layers.lock:
        return _packed_weight(module)


def _packed_weight(module: torch.nn.Linear) -> torch.Tensor:
    """``packed_weight`` for a caller that holds ``_routed_layers.lock``."""
    weight = module.weight
    known = _packed_weights.get(module)
    if known is not None and known.source is weight and known.version == _version(weight):
        return known.weight
    with torch.no_grad():
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach(), PACKED_FOR_ROWS
        )
    _packed_weights[module] = _Packed(weight, _version(weight), packed)
    return packed


def available_memory_bytes() -> int | None:
    """Memory the system can still hand out (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _packing_fits(linears: list[torch.nn.Linear]) -> bool:
    """Whether packed copies of the layers not packed yet fit in available memory."""
    needed = sum(
        module.weight.numel() * module.weight.element_size()
        for module in linears
        if module not in _packed_weights
    )
    available = available_memory_bytes()
    return available is None or needed <= _PACKING_MEMORY_SHARE * available


def _eligible(module: torch.nn.Linear) -> bool:
    """A plain float32 CPU ``nn.Linear`` whose forward nobody has replaced."""
    if type(module) is not torch.nn.Linear or "forward" in module.__dict__:
        # Subclasses (quantised layers) compute something else; an instance forward is
        # someone's hook (accelerate's offloading), which must keep running.
        return False
    weight = module.weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32


class OneDnnLinears:
    """Runs a model's linear layers on oneDNN's float32 kernel during the engine's passes.

    With ``packed`` (the default where memory allows) each layer gets a copy of its
    weight in oneDNN's blocked layout, made once and shared by every runner of the
    model, and every pass runs on it: a verify pass then costs little more than a
    one-token pass. Without, the layers use their own weights, which oneDNN reorders on
    each call, and only passes of several tokens are routed (one token is no faster).

    ``installed()`` sets each layer's ``forward`` to oneDNN's kernel (an instance
    attribute, so the layer's hooks still run) and removes it afterwards, also when the
    pass raises. A weight changed in place or replaced since it was packed is packed
    again. Layers shared by concurrent runners are counted: the kernel comes off a layer
    when the last pass using it ends. Outside ``installed()`` the model is untouched;
    code running the same model in another thread during such a pass runs it on oneDNN
    too (the same products, summed in another order).

    Args:
        linears: The layers to route (plain float32 CPU ``nn.Linear`` modules).
        packed: Run them on packed copies of their weights.
    """

    def __init__(self, linears: list[torch.nn.Linear], *, packed: bool) -> None:
        self.linears = linears
        self.packed = packed

    @property
    def min_tokens(self) -> int:
        """The shortest pass worth routing: every pass when packed, else two tokens."""
        return 1 if self.packed else 2

    @classmethod
    def for_model(
        cls, model: Any, vocab_size: int, *, pack: bool | None = None
    ) -> OneDnnLinears | None:
        """The model's eligible linear layers, or None when routing would not help or agree.

        Args:
            model: A causal LM.
            vocab_size: Width of its logits (for the probe input).
            pack: Pack the weights (None: when PyTorch can and the copies take at most
                half the available memory).

        Returns:
            None when PyTorch lacks oneDNN, the model has no eligible layer, or its
            logits on a probe input change when the layers run on oneDNN.
        """
        if not onednn_linear_available() or not isinstance(model, torch.nn.Module):
            return None
        linears = [
            module
            for module in model.modules()
            if isinstance(module, torch.nn.Linear) and _eligible(module)
        ]
        if not linears:
            return None
        if pack is None:
            pack = _packing_available() and _packing_fits(linears)
        candidate = cls(linears, packed=pack)
        probe = probe_tokens(vocab_size, linears[0].weight.device)
        try:
            with torch.inference_mode():
                expected = model(input_ids=probe, use_cache=False).logits
                with candidate.installed():
                    got = model(input_ids=probe, use_cache=False).logits
        except (RuntimeError, TypeError, ValueError, AttributeError):
            # An op this PyTorch build lacks, or a model that takes other arguments.
            return None
        return candidate if logits_agree(got, expected) else None

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Route the layers to oneDNN for the duration of the block."""
        with _routed_layers.applied(self.linears, self._route):
            yield

    def _route(self, module: torch.nn.Linear) -> Undo:
        """Set a layer's forward to oneDNN's kernel (``_routed_layers.lock`` held)."""
        weight = _packed_weight(module) if self.packed else module.weight
        module.forward = partial(  # type: ignore[method-assign]
            onednn_linear, weight=weight, bias=module.bias
        )

        def restore() -> None:
            del module.forward  # the class's forward again

        return restore


# ---- The vocabulary projection of the scored positions -------------------------------


class VocabularyHead:
    """Projects hidden states to logits with oneDNN's float32 matrix product.

    Holds a reference to the model's own projection weight (no copy: tied embeddings
    stay tied and no memory is added), or, once ``packed_from`` names the output layer
    whose weight ``OneDnnLinears`` packs, projects with that packed copy (a few rows
    then cost about what one does).

    Args:
        weight: The ``(vocab, hidden)`` weight of the model's output embeddings.
        bias: Its bias, if any.
        packed_from: The output layer to take a packed weight from (None: ``weight``).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        packed_from: torch.nn.Linear | None = None,
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.packed_from = packed_from

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(rows, vocab)`` for hidden states of shape ``(rows, hidden)``."""
        weight = self.weight if self.packed_from is None else packed_weight(self.packed_from)
        return onednn_linear(hidden, weight, self.bias)

    @classmethod
    def for_model(cls, model: Any) -> tuple[Any, VocabularyHead] | None:
        """The model's decoder and a head that reproduces its logits, or None.

        None when the model is not float32 on a CPU, PyTorch lacks the oneDNN kernel,
        the model has no ``get_decoder()`` or linear output embeddings, or the head's
        logits differ from the model's own forward on a probe input.
        """
        if not onednn_linear_available():
            return None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        get_decoder = getattr(model, "get_decoder", None)
        if not isinstance(head, torch.nn.Linear) or get_decoder is None:
            return None
        weight = head.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return None
        try:
            decoder = get_decoder()
        except (AttributeError, NotImplementedError):
            return None
        if decoder is None or decoder is model:
            return None
        candidate = cls(weight.detach(), None if head.bias is None else head.bias.detach())
        try:
            agrees = candidate._agrees_with(model, decoder)
        except (RuntimeError, TypeError, ValueError, AttributeError):
            # An op this PyTorch build lacks, or a decoder that takes other arguments.
            return None
        return (decoder, candidate) if agrees else None

    def _agrees_with(self, model: Any, decoder: Any) -> bool:
        """Whether decoder + this head give the model's own logits on a probe input."""
        probe = probe_tokens(int(self.weight.shape[0]), self.weight.device)
        with torch.inference_mode():
            expected = model(input_ids=probe, use_cache=False).logits[0]
            hidden = decoder(input_ids=probe, use_cache=False).last_hidden_state[0]
            got = self(hidden)
        return logits_agree(got, expected)


# ---- Grouped-query attention on the key/value heads as they are ----------------------

ATTENTION_NAME = "speculative_llm_sdpa"
"""The name the attention function is registered under in transformers."""

# The implementation the function stands in for: other names (eager, flash, flex) are
# left alone.
_REPLACED = "sdpa"

# Configs may be shared by runners in several threads (a model drafting for itself).
_switched_configs: CountedPatches[Any] = CountedPatches()


def _switch_implementation(config: Any) -> Undo:
    """Point a config's SDPA at ``grouped_sdpa_attention``; return how to switch back."""
    original = config._attn_implementation
    if original == _REPLACED:
        config._attn_implementation = ATTENTION_NAME

    def restore() -> None:
        config._attn_implementation = original

    return restore


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention as transformers computes it, on grouped heads for masked CPU passes.

    Same signature and result as ``transformers.integrations.sdpa_attention``'s
    ``sdpa_attention_forward``, which computes every case this function does not.
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    if (
        groups > 1
        and query.shape[2] > 1
        and query.device.type == "cpu"
        and isinstance(attention_mask, torch.Tensor)
        and dropout == 0.0
        and key.shape[-1] == value.shape[-1]
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    ):
        # softmax(q k^T * scale + mask) v, key/value head h // groups for query head h.
        attention = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
        )
        return attention.transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    result: tuple[torch.Tensor, None] = sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )
    return result


def _register() -> bool:
    """Register the function and SDPA's mask under ``ATTENTION_NAME``; False if unsupported."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # transformers without pluggable attention
        return False
    if _REPLACED not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        return False
    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa_attention)
    # The same mask as SDPA's: without a registered mask the model would pass none.
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS[_REPLACED])
    return True


def _grouped_configs(model: torch.nn.Module) -> list[Any]:
    """The configs read by the model's grouped-query attention layers, once each."""
    configs: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if int(getattr(module, "num_key_value_groups", 1)) > 1 and config is not None:
            configs.setdefault(id(config), config)
    return list(configs.values())


def _causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """A ``(1, 1, length, length)`` boolean causal mask (True: may attend)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


class GroupedAttention:
    """Switches a model's SDPA attention to ``grouped_sdpa_attention`` during passes.

    ``installed()`` sets the attention implementation of the configs the model's
    grouped-query layers read to ``ATTENTION_NAME`` and restores the previous one
    afterwards, also when the pass raises; a config that no longer says ``sdpa`` (the
    user switched the model to another implementation) is left alone. Configs shared
    by concurrent runners are counted: the original comes back when the last pass using
    it ends. Code running the same model in another thread during such a pass uses the
    function too (the same result).

    Args:
        configs: The configs to switch (each read by grouped-query attention layers).
    """

    def __init__(self, configs: list[Any]) -> None:
        self.configs = configs

    @classmethod
    def for_model(cls, model: Any, vocab_size: int) -> GroupedAttention | None:
        """The switch for ``model``, or None when it would not apply or would change logits.

        Args:
            model: A causal LM.
            vocab_size: Width of its logits (for the probe input).

        Returns:
            None when the model is not on a CPU, has no grouped-query attention layer on
            SDPA, runs on a transformers or PyTorch without what the function needs, or
            gives other logits with it on a masked probe.
        """
        if not isinstance(model, torch.nn.Module):
            return None
        parameter = next(model.parameters(), None)
        if parameter is None or parameter.device.type != "cpu":
            return None
        configs = [
            config
            for config in _grouped_configs(model)
            if getattr(config, "_attn_implementation", None) == _REPLACED
        ]
        if not configs or not _register():
            return None
        candidate = cls(configs)
        probe = probe_tokens(vocab_size, parameter.device)
        # A mask, so that the probe takes the path the function changes (a pass without
        # one gets grouped heads from transformers already).
        mask = _causal_mask(probe.shape[1], parameter.device)
        try:
            with torch.inference_mode():
                expected = model(input_ids=probe, attention_mask=mask, use_cache=False).logits
                with candidate.installed():
                    got = model(input_ids=probe, attention_mask=mask, use_cache=False).logits
        except (RuntimeError, TypeError, ValueError, AttributeError, KeyError):
            # PyTorch without enable_gqa, or a model that takes other arguments.
            return None
        return candidate if logits_agree(got, expected) else None

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Use ``grouped_sdpa_attention`` for the duration of the block."""
        with _switched_configs.applied(self.configs, _switch_implementation):
            yield


# ---- A KV cache whose full-attention layers grow in place ----------------------------

# Rows a buffer starts with at the least: a prompt of this size never regrows.
_MIN_CAPACITY = 256


def _grown(buffer: torch.Tensor | None, filled: torch.Tensor, needed: int) -> torch.Tensor:
    """A buffer shaped like ``filled`` with room for ``needed`` rows, holding ``filled``.

    ``buffer`` is reused when ``filled`` is a view of its first rows (a tensor put there
    by other code, such as a batch reordering, is copied into a new one) and has room.
    """
    batch, heads, _, width = filled.shape
    if (
        buffer is not None
        and filled.data_ptr() == buffer.data_ptr()
        and buffer.shape[-2] >= needed
        and buffer.shape[:2] == (batch, heads)
        and buffer.shape[-1] == width
        and buffer.dtype == filled.dtype
        and buffer.device == filled.device
    ):
        return buffer
    capacity = max(needed, _MIN_CAPACITY, 2 * (0 if buffer is None else buffer.shape[-2]))
    grown = torch.empty(batch, heads, capacity, width, dtype=filled.dtype, device=filled.device)
    grown[..., : filled.shape[-2], :] = filled
    return grown


@functools.cache
def growing_layer_class() -> type:
    """``GrowingLayer``, defined on first use (it subclasses a transformers class)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[misc,no-untyped-call]
        """A ``DynamicLayer`` that appends into preallocated buffers (no copy per pass)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)  # type: ignore[no-untyped-call]
            self._key_buffer: torch.Tensor | None = None
            self._value_buffer: torch.Tensor | None = None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys: torch.Tensor | None = self.keys
            values: torch.Tensor | None = self.values
            if keys is None or values is None or keys.dim() != key_states.dim():
                # The empty placeholder of a fresh layer: start from no rows.
                keys, values = key_states[..., :0, :], value_states[..., :0, :]
            start = keys.shape[-2]
            end = start + key_states.shape[-2]
            key_buffer = _grown(self._key_buffer, keys, end)
            value_buffer = _grown(self._value_buffer, values, end)
            # Rows past ``start`` belong to tokens cropped away (or were never written).
            key_buffer[..., start:end, :] = key_states
            value_buffer[..., start:end, :] = value_states
            self._key_buffer, self._value_buffer = key_buffer, value_buffer
            self.keys = key_buffer[..., :end, :]
            self.values = value_buffer[..., :end, :]
            return self.keys, self.values

        def reset(self) -> None:
            super().reset()
            # Free the memory with the sequence, as DynamicLayer does.
            self._key_buffer = self._value_buffer = None

    return GrowingLayer


def new_cache(config: Any) -> Any:
    """An empty ``DynamicCache`` for a model, its plain full-attention layers growing in place.

    Args:
        config: The model's config (sliding-window layers get their own smaller layers).

    Returns:
        A ``transformers.DynamicCache``.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    layers = cache.layers
    growing = growing_layer_class()
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[index] = growing()
    return cache


# ---- One probe per model ---------------------------------------------------------------


def _cache_layers_agree(model: Any, vocab_size: int) -> bool:
    """Whether a decode along ``new_cache`` gives the logits of transformers' own cache."""
    from transformers import DynamicCache

    probe = probe_tokens(vocab_size, next(model.parameters()).device)
    keyword = "cache" if "cache" in _forward_parameters(model) else "past_key_values"
    seen: list[torch.Tensor] = []
    for cache in (new_cache(model.config), DynamicCache(config=model.config)):
        with torch.inference_mode():
            first = model(input_ids=probe[:, :5], use_cache=True, **{keyword: cache}).logits
            second = model(input_ids=probe[:, 5:], use_cache=True, **{keyword: cache}).logits
        seen.append(torch.cat([first, second], dim=1))
    return bool(torch.equal(seen[0], seen[1]))


def _forward_parameters(model: Any) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


@dataclass(slots=True)
class FastPaths:
    """The fast paths a model's runners use, found by one probe at load.

    Attributes:
        head: The decoder and the ``VocabularyHead`` that projects its output, or None.
        linears: The layers routed to oneDNN during passes, or None.
        attention: The attention switch used for passes of several tokens, or None.
        growing_cache: Whether caches use ``GrowingLayer`` (``new_cache``).
        reasons: For each path, ``on`` or why it is off.
    """

    head: tuple[Any, VocabularyHead] | None = None
    linears: OneDnnLinears | None = None
    attention: GroupedAttention | None = None
    growing_cache: bool = False
    reasons: dict[str, str] = field(default_factory=dict)

    @classmethod
    def off(cls) -> FastPaths:
        """No fast path: the model runs as transformers runs it."""
        reason = "off (fast_paths='off')"
        names = ("oneDNN linears", "vocabulary head", "grouped attention", "in-place KV cache")
        return cls(reasons=dict.fromkeys(names, reason))

    @classmethod
    def probe(
        cls,
        model: Any,
        vocab_size: int,
        mode: FastPathsMode = "auto",
        *,
        only: frozenset[str] = PATHS,
    ) -> FastPaths:
        """Try every fast path on ``model``; log which are on and why the others are off.

        Args:
            model: A causal LM.
            vocab_size: Width of its logits (for the probe inputs).
            mode: ``auto`` or ``off``.
            only: The paths to try, among ``PATHS`` (tests compare one path at a time).

        Raises:
            ValueError: An unknown mode or path.
        """
        if mode not in ("auto", "off"):
            raise ValueError(f"fast_paths must be 'auto' or 'off', got {mode!r}")
        if not only <= PATHS:
            raise ValueError(
                f"unknown fast paths {sorted(only - PATHS)}; choose from {sorted(PATHS)}"
            )
        if mode == "off":
            paths = cls.off()
            logger.info("transformers runner: %s", paths.describe())
            return paths
        paths = cls()
        parameter = next(model.parameters(), None) if isinstance(model, torch.nn.Module) else None
        on_cpu = parameter is not None and parameter.device.type == "cpu"
        float32 = parameter is not None and parameter.dtype == torch.float32
        kernel = onednn_linear_available()
        unsupported = (
            "the model is not float32 on a CPU"
            if not (on_cpu and float32)
            else "this PyTorch build has no oneDNN linear kernel"
        )
        probe_failed = "its probe did not reproduce the model's logits"
        if on_cpu and float32 and kernel:
            if "linears" in only:
                paths.linears = OneDnnLinears.for_model(model, vocab_size)
            if "head" in only:
                paths.head = VocabularyHead.for_model(model)
        not_asked = "not asked for"
        paths.reasons["oneDNN linears"] = (
            ("on, packed weights" if paths.linears.packed else "on, the layers' own weights")
            if paths.linears is not None
            else (
                not_asked
                if "linears" not in only
                else probe_failed
                if on_cpu and float32 and kernel
                else unsupported
            )
        )
        if paths.head is not None and paths.linears is not None and paths.linears.packed:
            output_layer = model.get_output_embeddings()
            if any(layer is output_layer for layer in paths.linears.linears):
                # Its packed copy exists anyway (and passed the linears' probe, which ran
                # the whole model): project with it.
                decoder, head = paths.head
                paths.head = (
                    decoder,
                    VocabularyHead(head.weight, head.bias, packed_from=output_layer),
                )
        paths.reasons["vocabulary head"] = (
            "on"
            if paths.head is not None
            else (
                not_asked
                if "head" not in only
                else probe_failed
                if on_cpu and float32 and kernel
                else unsupported
            )
        )
        if on_cpu and "attention" in only:
            paths.attention = GroupedAttention.for_model(model, vocab_size)
        paths.reasons["grouped attention"] = (
            "on"
            if paths.attention is not None
            else (
                not_asked
                if "attention" not in only
                else "the model is not on a CPU"
                if not on_cpu
                else "no grouped-query SDPA layer, or its probe changed the logits"
            )
        )
        cache_reason = not_asked
        if "cache" in only:
            try:
                paths.growing_cache = _cache_layers_agree(model, vocab_size)
                cache_reason = "on" if paths.growing_cache else probe_failed
            except (RuntimeError, TypeError, ValueError, AttributeError) as error:
                cache_reason = f"its probe failed ({type(error).__name__})"
        paths.reasons["in-place KV cache"] = cache_reason
        logger.info("transformers runner: %s", paths.describe())
        return paths

    def describe(self) -> str:
        """One line: each path and its state."""
        return "fast paths: " + "; ".join(f"{name} {state}" for name, state in self.reasons.items())

    @property
    def names_on(self) -> list[str]:
        """The paths in use."""
        return [name for name, state in self.reasons.items() if state.startswith("on")]
