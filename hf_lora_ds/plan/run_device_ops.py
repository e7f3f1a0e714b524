"""What a training run's device and engine do that the planner's meta-device forward does not, for the tensors
autograd saves (hf_lora_ds.plan.model_shape counts them): autocast's casts, CUDA's fused dropout and ZeRO-3's linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["RunDeviceOps"]


class RunDeviceOps(TorchFunctionMode):
    """What the run's device and engine do that the meta device does not, for the tensors autograd saves.

    ``autocast_dtype``: autocast's casts, which the meta device has none of: the matmuls' floating inputs (weights
    too) in that dtype. What differs from a 16-bit forward without it is LoRA's: the fp32 adapters' matmuls save a
    16-bit copy of their input instead of PEFT's fp32 one. ``fused_dropout``: CUDA's dropout is ``native_dropout``,
    which saves a bool mask; elsewhere (the CPU, meta) it multiplies by a noise tensor in the input's dtype and keeps
    that: a fp32 adapter input's mask is 4 bytes an element on the CPU and 1 on a GPU. ``zero3_linear``: DeepSpeed's
    ZeRO-3 replaces ``F.linear`` with its own (``zero_optimization.memory_efficient_linear``, on by default), which
    keeps the input of every linear layer, a frozen one's too (``_Zero3Linear``)."""

    _MATMULS = frozenset({F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, F.conv1d})

    def __init__(self, autocast_dtype: torch.dtype | None, fused_dropout: bool, zero3_linear: bool = False):
        super().__init__()
        self.autocast_dtype, self.fused_dropout, self.zero3_linear = autocast_dtype, fused_dropout, zero3_linear

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._MATMULS and self.autocast_dtype is not None:
            args = tuple(self._cast(arg) for arg in args)
            kwargs = {key: self._cast(value) for key, value in kwargs.items()}
        if func is F.dropout and self.fused_dropout:
            return _fused_dropout(*args, **kwargs)
        if func is F.linear and self.zero3_linear:
            return _zero3_linear(*args, **kwargs)
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


class _Zero3Linear(torch.autograd.Function):
    """``F.linear`` as DeepSpeed's ``LinearFunctionForZeroStage3`` saves for backward: input, weight and bias, whether
    or not the weight needs a gradient (a frozen base layer's input is kept where plain ``F.linear`` keeps only the
    weight)."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(input, weight, bias)
        output = input.matmul(weight.t())
        return output if bias is None else output + bias

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # never run: the planner's forward is on the meta device
        raise NotImplementedError


def _zero3_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _Zero3Linear.apply(input, weight, bias)
