"""``--batching`` resolved once, from the flags: ``auto`` becomes padded or padding-free by the attention kernel, and
padded for a model with linear-attention, state-space or short-convolution layers once the model is known."""

from __future__ import annotations

from typing import Literal

__all__ = ["VARLEN_ATTENTION", "Batching", "ResolvedBatching", "is_flash_attention", "resolve_batching"]

# torch's own FlashAttention-2 varlen kernel behind transformers' attention interface: hf_lora_ds.model.varlen_attention
VARLEN_ATTENTION = "varlen_attn"

Batching = Literal["auto", "padded", "padding_free", "packed"]
ResolvedBatching = Literal["padded", "padding_free", "packed"]


def is_flash_attention(attn_implementation: str | None) -> bool:
    """Whether the kernel is a flash-attention one: its varlen path reads sequence boundaries from the position ids
    (or, for ``varlen_attn``, the batch's ``cu_seq_lens``) of one flattened row, without a mask."""
    return "flash" in (attn_implementation or "") or attn_implementation == VARLEN_ATTENTION


def resolve_batching(
    batching: Batching, attn_implementation: str | None, sequence_mixers: bool = False
) -> ResolvedBatching:
    """``auto``: padding-free with flash attention, where no token is padding and it is fastest; padded (and, by
    default, length-grouped) under sdpa and eager, which build a full mask for a flattened batch (bench/padding.py),
    and for a model with ``sequence_mixers`` besides attention, which need kernels to keep flattened samples apart
    (hf_lora_ds.model.packed_boundaries). A resolved value is returned as it is."""
    if batching == "auto":
        return "padding_free" if is_flash_attention(attn_implementation) and not sequence_mixers else "padded"
    return batching
