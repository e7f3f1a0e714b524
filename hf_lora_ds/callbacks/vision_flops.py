"""The FLOPs a vision-language model's vision tower and projector really spend, counted as they run.

Their cost is per image, not per text token, and depends on each image's size (native-resolution towers such as
Qwen-VL's see as many patches as the image has), so the per-token formula of the language model cannot hold it.
Forward hooks on the tower's and projector's matmuls (``nn.Linear``, the patch embedding's convolution) and on the
tower's attention layers count each training forward from the shapes that ran: a matmul of ``m`` multiply-adds is
``2m`` FLOPs forward, and ``2m`` more in backward for each of its input and weight that gets a gradient. A frozen
tower runs without an autograd graph (hf_lora_ds.vision.modules): its output needs no gradient, so it costs its
forward alone; a trained projector or a tower with LoRA pays its backward as it is. Attention over a span of ``s``
patches is ``4·s²·d`` forward (scores and values), twice that again in backward when its input gets a gradient; the
spans are the tower's own (Qwen-VL's ``cu_seqlens``: each image, or each window, apart).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hf_lora_ds.vision.modules import vision_parts

__all__ = ["VisionFlops"]

_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


class VisionFlops:
    """Hooks counting the vision tower's and projector's training FLOPs; ``take()`` returns those since the last
    call. Nothing is hooked for a text-only model."""

    def __init__(self, model: nn.Module) -> None:
        self.flops = 0
        self._handles: list = []
        parts = vision_parts(model)
        if parts is None:
            return
        roots = [model.get_submodule(root) for root in (parts.tower, *parts.projectors)]
        modules = {id(module): module for root in roots for module in root.modules()}  # Qwen-VL's merger once
        for module in modules.values():
            hook = _hook_for(module)
            if hook is not None:
                self._handles.append(module.register_forward_hook(self._counting(hook), with_kwargs=True))

    def _counting(self, flops_of: Callable[[nn.Module, tuple, dict, object], int]):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            if module.training:
                self.flops += flops_of(module, args, kwargs, output)

        return hook

    def take(self) -> int:
        taken, self.flops = self.flops, 0
        return taken

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _hook_for(module: nn.Module) -> Callable | None:
    if isinstance(module, nn.Linear):
        return _linear_flops
    if isinstance(module, _CONVOLUTIONS):
        return _conv_flops
    if isinstance(module, nn.MultiheadAttention):  # SigLIP's pooling head: its projections are no Linear calls
        return _multihead_flops
    if type(module).__name__.endswith("Attention"):
        return _attention_flops
    if not isinstance(module, nn.Embedding) and any(p.dim() == 2 for p in module.parameters(recurse=False)):
        return _weight_matmul_flops  # Gemma 3's projector multiplies by its weight without a Linear
    return None


def _with_backward(multiply_adds: int, inputs: torch.Tensor | bool, weight: torch.Tensor, output: torch.Tensor) -> int:
    """Forward 2m; backward 2m for the input's gradient and 2m for the weight's, each only when it is computed."""
    backward = output.requires_grad and torch.is_grad_enabled()
    input_grad = inputs.requires_grad if isinstance(inputs, torch.Tensor) else inputs
    factor = 1 + (backward and input_grad) + (backward and weight.requires_grad)
    return 2 * multiply_adds * factor


def _linear_flops(module: nn.Linear, args: tuple, kwargs: dict, output: torch.Tensor) -> int:
    inputs = args[0] if args else kwargs["input"]
    return _with_backward(output.numel() * module.in_features, inputs, module.weight, output)


def _conv_flops(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> int:
    per_output = module.in_channels // module.groups * int(torch.tensor(module.kernel_size).prod())
    return _with_backward(output.numel() * per_output, args[0], module.weight, output)


def _weight_matmul_flops(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> int:
    """A module that multiplies its output rows by its own 2-D weights: each row, each weight, once. What the weight
    multiplies needs a gradient when the module's input does or another of its weights (a norm before it) trains."""
    rows = output.numel() // output.shape[-1]
    weights = [param for param in module.parameters(recurse=False) if param.dim() == 2]
    inputs = args[0] if args else next(iter(kwargs.values()))
    return sum(
        _with_backward(rows * weight.numel(), _feeds_gradient(module, inputs, weight), weight, output)
        for weight in weights
    )


def _feeds_gradient(module: nn.Module, inputs: torch.Tensor, weight: torch.Tensor) -> bool:
    return inputs.requires_grad or any(p.requires_grad for p in module.parameters() if p is not weight)


def _attention_flops(module: nn.Module, args: tuple, kwargs: dict, output: object) -> int:
    """Scores and values over each span the layer attends within: ``cu_seqlens`` where the tower packs its images
    (or windows) into one row, else each row of a ``(batch, length, width)`` input."""
    hidden = args[0] if args else kwargs["hidden_states"]
    boundaries = kwargs.get("cu_seqlens", args[1] if len(args) > 1 and _is_boundaries(args[1]) else None)
    width = hidden.shape[-1]
    if boundaries is not None:
        spans = (boundaries[1:] - boundaries[:-1]).to(torch.int64)
        squares = int((spans * spans).sum())
    else:
        rows = hidden.shape[0] if hidden.dim() == 3 else 1
        squares = rows * hidden.shape[-2] ** 2
    backward = hidden.requires_grad and torch.is_grad_enabled()
    return 4 * squares * width * (3 if backward else 1)


def _multihead_flops(module: nn.MultiheadAttention, args: tuple, kwargs: dict, output: object) -> int:
    """``nn.MultiheadAttention``: the query and output projections over the queries, the key and value projections
    over the keys, and the attention between them, forward only (a frozen tower's head)."""
    query, key = args[0], args[1] if len(args) > 1 else kwargs["key"]
    batch_dim, length_dim = (0, 1) if module.batch_first else (1, 0)
    rows, queries, keys = query.shape[batch_dim], query.shape[length_dim], key.shape[length_dim]
    width = module.embed_dim
    backward = query.requires_grad and torch.is_grad_enabled()
    forward = 2 * rows * (2 * queries + 2 * keys) * width * width + 4 * rows * queries * keys * width
    return forward * (3 if backward else 1)


def _is_boundaries(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point()
