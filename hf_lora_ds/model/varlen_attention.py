"""``--attn_implementation varlen_attn``: torch's own FlashAttention-2 varlen kernel (``torch.nn.attention.varlen``,
no flash_attn install) behind transformers' attention interface, for padding-free batches and packed rows flattened
into one row.

Without flash_attn a CUDA run gets sdpa, which on a flattened row builds a full block-diagonal mask, so ``--batching
auto`` pads. This kernel reads each sample's bounds from the batch's ``cu_seq_lens_q``/``_k`` and ``max_length_q``/
``_k``, which the collator computed on the host (the maxima as Python ints: no device-to-host sync), and attends
within each sample only. On CUDA it calls ``varlen_attn`` (causal, GQA, a layer's sliding window); elsewhere the same
bounds drive one causal sdpa per sample, so the CPU suite runs the whole path. It is registered when a run's model
loads with it (``register_varlen_attention``), never on import, and not in transformers' mask registry: a kernel
missing there gets no mask built at all, which is flash's behaviour for a flattened row, without a global entry.
Generation (left padding, a KV cache, no bounds) runs under sdpa (hf_lora_ds.eval.generation).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig
from transformers.integrations.flash_attention import get_target_dtype
from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_lora_ds.config.batching import VARLEN_ATTENTION
from hf_lora_ds.errors import UserError
from hf_lora_ds.vision.modules import vision_model_class

__all__ = ["Bounds", "register_varlen_attention", "varlen_attention_forward"]

_FLAG = f"--attn_implementation {VARLEN_ATTENTION}"
_BOUND_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


class Bounds(NamedTuple):
    """Where each sample of the flattened batch starts (then the end), for queries and keys, and the longest."""

    cu_seq_lens_q: torch.Tensor
    cu_seq_lens_k: torch.Tensor
    max_length_q: int
    max_length_k: int


def register_varlen_attention(config: PretrainedConfig) -> None:
    """Make ``varlen_attn`` a name transformers accepts, for a run whose model loads with it. The entry goes into
    the shared registry's per-process overrides (where DeepSpeed puts its Ulysses wrapper), not the class-wide map.
    A vision-language model is refused: its tower's bidirectional attention and Qwen-VL's (4, B, L) positions are
    not proven with this kernel."""
    if vision_model_class(config) is not None:
        raise UserError(f"{_FLAG}: vision-language models are not supported; use sdpa or flash_attention_2")
    _check_config(config.get_text_config())
    ALL_ATTENTION_FUNCTIONS[VARLEN_ATTENTION] = varlen_attention_forward


def _check_config(text: PretrainedConfig) -> None:
    """What the config says the layers do that this kernel cannot, refused at loading (before any step); the
    forward's checks (``_check_supported``) catch what a config does not name."""
    if getattr(text, "attn_logit_softcapping", None):
        raise UserError(f"{_FLAG}: this model softcaps its attention logits or has attention sinks; use eager")
    if getattr(text, "attention_dropout", 0.0):
        raise UserError(
            f"{_FLAG}: the model's attention_dropout ({text.attention_dropout}) is not applied by this kernel; use sdpa"
        )


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` (B, Hq, L, D), ``key``/``value`` (B, Hkv, S, D) of a flattened
    batch to (B, L, Hq, D), each sample attending causally to itself only. ``attention_mask`` is unused: the bounds
    come from ``kwargs``."""
    _check_supported(module, dropout, kwargs)
    bounds = _bounds(kwargs)
    batch, _, length, _ = query.shape
    q, k, v = (_tokens_first(tensor) for tensor in (query, key, value))
    if query.is_cuda:
        q, k, v = _half_precision(module, q, k, v)
        out = flash_varlen(q, k, v, bounds, scaling, sliding_window)
    else:
        out = per_sample_sdpa(q, k, v, bounds, scaling, sliding_window)
    return out.view(batch, length, *out.shape[1:]), None


def flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: Bounds,
    scaling: float | None,
    sliding_window: int | None,
) -> torch.Tensor:
    """The CUDA path: (T, H, D) tokens through ``varlen_attn``, causal within each sample. FlashAttention needs one
    head dim for query and value: a narrower value (MLA) is padded and the output cropped, as transformers' flash
    path does."""
    from torch.nn.attention.varlen import varlen_attn

    value_dim = v.shape[-1]
    if value_dim != q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - value_dim))
    options = _kernel_options(_keywords(varlen_attn), q, k, scaling, sliding_window)
    out = varlen_attn(
        q, k, v, bounds.cu_seq_lens_q, bounds.cu_seq_lens_k, bounds.max_length_q, bounds.max_length_k, **options
    )
    return out[..., :value_dim]


@functools.cache
def _keywords(kernel: Any) -> frozenset[str]:
    """The keyword arguments the kernel takes, read once (the forward of every layer asks)."""
    return frozenset(inspect.signature(kernel).parameters)


def _kernel_options(
    keywords: frozenset[str], q: torch.Tensor, k: torch.Tensor, scaling: float | None, sliding_window: int | None
) -> dict[str, Any]:
    """The causal window, scale and GQA in the keywords this torch's ``varlen_attn`` takes: torch 2.10 has
    ``is_causal`` and no window, 2.11 a window and a scale, 2.13 ``enable_gqa`` too (before it FlashAttention takes
    fewer key than query heads as they are). A window (-1, 0) is causal; a sliding window of W keys (transformers:
    ``kv_idx > q_idx - W``) is W - 1 to the left."""
    options: dict[str, Any] = {}
    if "window_size" in keywords:
        options["window_size"] = (-1, 0) if sliding_window is None else (sliding_window - 1, 0)
    elif sliding_window is None:
        options["is_causal"] = True
    else:
        raise UserError(f"{_FLAG}: torch {torch.__version__}'s varlen_attn has no sliding window (2.11 has); use sdpa")
    if "scale" in keywords:
        options["scale"] = scaling
    elif scaling is not None and not math.isclose(scaling, q.shape[-1] ** -0.5):
        raise UserError(f"{_FLAG}: torch {torch.__version__}'s varlen_attn takes no attention scale; use sdpa")
    if "enable_gqa" in keywords:
        options["enable_gqa"] = q.shape[1] != k.shape[1]
    return options


def per_sample_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: Bounds,
    scaling: float | None,
    sliding_window: int | None,
) -> torch.Tensor:
    """Off CUDA: one causal sdpa per sample of the (T, H, D) tokens, GQA as transformers' sdpa path does it."""
    groups = q.shape[1] // k.shape[1]
    gqa = groups > 1 and use_gqa_in_sdpa(None, k, v)
    starts_q, starts_k = bounds.cu_seq_lens_q.tolist(), bounds.cu_seq_lens_k.tolist()
    outputs = []
    for q0, q1, k0, k1 in zip(starts_q, starts_q[1:], starts_k, starts_k[1:]):
        qi, ki, vi = (tensor[a:b].transpose(0, 1)[None] for tensor, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        if groups > 1 and not gqa:
            ki, vi = repeat_kv(ki, groups), repeat_kv(vi, groups)
        mask = _sliding_mask(q1 - q0, sliding_window, q.device)
        out = F.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, is_causal=mask is None, scale=scaling, enable_gqa=gqa
        )
        outputs.append(out[0].transpose(0, 1))
    return torch.cat(outputs)


def _sliding_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Causal within the last ``window`` keys, as transformers' sliding-window mask; None where causal is enough."""
    if window is None or length <= window:
        return None
    positions = torch.arange(length, device=device)
    behind = positions[:, None] - positions[None, :]
    return (behind >= 0) & (behind < window)


def _tokens_first(tensor: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) to the (B * L, H, D) tokens the varlen kernel takes; the bounds index the flattened batch."""
    return tensor.transpose(1, 2).reshape(-1, tensor.shape[1], tensor.shape[-1])


def _half_precision(module: torch.nn.Module, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """FlashAttention runs in bf16/fp16: fp32 activations (autocast, PEFT's fp32 norms) are cast as transformers' flash
    path casts them; a model held in fp32 without autocast is refused."""
    target = get_target_dtype(tensors[0], module)
    if target is not None:
        tensors = tuple(tensor.to(target) for tensor in tensors)
    if tensors[0].dtype not in (torch.bfloat16, torch.float16):
        raise UserError(f"{_FLAG} runs in bfloat16 or float16 on CUDA: add --bf16 (or --dtype bfloat16)")
    return tensors


def _check_supported(module: torch.nn.Module, dropout: float, kwargs: dict[str, Any]) -> None:
    """What this kernel cannot do, refused rather than silently dropped."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise UserError(f"{_FLAG}: this model softcaps its attention logits or has attention sinks; use eager")
    if dropout:
        raise UserError(f"{_FLAG}: the model's attention_dropout ({dropout}) is not applied by this kernel; use sdpa")
    if not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        raise UserError(f"{_FLAG}: {type(module).__name__} attends bidirectionally; use sdpa")


def _bounds(kwargs: dict[str, Any]) -> Bounds:
    """The batch's sample bounds, which a padded batch (or a forward outside training) does not carry."""
    if any(kwargs.get(key) is None for key in _BOUND_KEYS):
        raise UserError(
            f"{_FLAG} needs padding-free or packed batches (each sample's cu_seq_lens); this forward has none: use "
            "--batching padding_free (or packed, or auto)"
        )
    return Bounds(*(kwargs[key] for key in _BOUND_KEYS))
