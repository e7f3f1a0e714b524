"""What a training run's device does that the planner's meta-device forward does not, for the tensors autograd saves
(hf_lora_ds.plan.model_shape counts them): autocast's casts, and CUDA's fused dropout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["RunDeviceOps"]


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
