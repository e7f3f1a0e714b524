"""What a training run's device does that the planner's meta-device forward does not, for the tensors autograd saves
(hf_lora_ds.plan.model_shape counts them): autocast's casts, CUDA's fused dropout and fused attention kernels."""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import AttentionInterface

__all__ = ["RunDeviceOps", "meta_attention"]

_FUSED = "hf_lora_ds_plan_fused"  # registered name of the stand-in attention


class RunDeviceOps(TorchFunctionMode):
    """What the run's device does that the meta device does not, for the tensors autograd saves.

    ``autocast_dtype``: autocast's casts, which the meta device has none of: the matmuls' floating inputs (weights
    too) in that dtype. What differs from a 16-bit forward without it is LoRA's: the fp32 adapters' matmuls save a
    16-bit copy of their input instead of PEFT's fp32 one. ``fused_dropout``: CUDA's dropout is ``native_dropout``,
    which saves a bool mask; elsewhere (the CPU, meta) it multiplies by a noise tensor in the input's dtype and keeps
    that: a fp32 adapter input's mask is 4 bytes an element on the CPU and 1 on a GPU."""

    _MATMULS = frozenset({F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, F.conv1d})

    def __init__(self, autocast_dtype: torch.dtype | None, fused_dropout: bool):
        super().__init__()
        self.autocast_dtype, self.fused_dropout = autocast_dtype, fused_dropout

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._MATMULS and self.autocast_dtype is not None:
            args = tuple(self._cast(arg) for arg in args)
            kwargs = {key: self._cast(value) for key, value in kwargs.items()}
        if func is F.dropout and self.fused_dropout:
            return _fused_dropout(*args, **kwargs)
        return func(*args, **kwargs)

    def _cast(self, value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != self.autocast_dtype:
            return value.to(self.autocast_dtype)
        return value


def _fused_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """``F.dropout`` as CUDA runs it (ATen's ``dropout`` takes ``native_dropout`` for a CUDA input with 0 < p < 1)."""
    if not training or not 0 < p < 1:
        return input
    return torch.native_dropout(input, p, True)[0]


def meta_attention(attn: str | None) -> str:
    """The attention the planner's meta forward runs: eager as it is (it keeps the scores), every other kernel as a
    fused one."""
    if attn == "eager":
        return "eager"
    _register_fused_attention()
    return _FUSED


class _FusedAttention(torch.autograd.Function):
    """Shapes only: what a fused attention kernel saves (query, key, value, output, an fp32 log-sum-exp per row)."""

    @staticmethod
    def forward(ctx, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        batch, heads, length, _ = query.shape
        output = query.new_empty(batch, length, heads, value.shape[-1])
        logsumexp = query.new_empty(batch, heads, length, dtype=torch.float32)
        ctx.save_for_backward(query, key, value, output, logsumexp)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # never run: the planner's forward is on the meta device
        raise NotImplementedError


def _fused_attention_forward(module, query, key, value, attention_mask, **kwargs):
    return _FusedAttention.apply(query, key, value), None


@cache
def _register_fused_attention() -> None:
    AttentionInterface.register(_FUSED, _fused_attention_forward)
