"""A plain LoRA layer's update added to its output by one matmul during a training step.

PEFT adds it as ``result + lora_B(lora_A(dropout(x))) * scaling``: three passes over the layer's whole output (the
update written, scaled, added) and in backward a fourth that scales its gradient. ``addmm`` (C + alpha·h·Bᵀ) makes
the same sum inside the matmul, as Unsloth's LoRA kernels do: the output is read and written once and the scale
falls on the rank-r factors. Around a training step the layers listed here compute their update that way (a PEFT
LoRA variant registered for the step only); outside it (evaluation, generation, merging) PEFT's form is back.
The bypassed ``lora_B`` call must do nothing but its matmul: not under ZeRO-3, which gathers its weight in that call,
nor where a hook sits on it when the step begins (ZeRO-3's on every module, accelerate's device map, a user's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora.layer import LoraVariant

__all__ = ["one_matmul_layers", "updates_in_one_matmul"]


class _OneMatmulUpdate(LoraVariant):
    """PEFT's vanilla LoRA forward with the update's matmul, scale and sum in one ``addmm``."""

    @staticmethod
    def forward(
        module: LoraLinear, active_adapter: str, x: torch.Tensor, result: torch.Tensor, **kwargs
    ) -> torch.Tensor:
        rows = module.lora_A[active_adapter](module.lora_dropout[active_adapter](x))
        lora_b, scaling = module.lora_B[active_adapter], module.scaling[active_adapter]
        if rows.dtype != result.dtype and not torch.is_autocast_enabled(result.device.type):
            return result + lora_b(rows) * scaling  # PEFT promotes a 16-bit result to the adapters' fp32
        outputs = result.shape[-1]
        summed = torch.addmm(
            result.reshape(-1, outputs), rows.reshape(-1, rows.shape[-1]), lora_b.weight.t(), alpha=scaling
        )
        return summed.view(result.shape)


def one_matmul_layers(model: torch.nn.Module, partitioned: bool) -> list[LoraLinear]:
    """The plain LoRA linear layers (no variant, no ``lora_bias``, no subclass with its own forward); none when ZeRO-3
    partitions the model (``partitioned``)."""
    if partitioned:
        return []
    return [
        module
        for module in model.modules()
        if type(module) is LoraLinear
        and not module.lora_variant
        and all(lora_b.bias is None for lora_b in module.lora_B.values())
    ]


def _unhooked(layer: LoraLinear) -> bool:
    # read from the instance's dict: hasattr on a module raises through Module.__getattr__ (~4 us a layer, every step)
    hooked = (b._forward_pre_hooks or b._forward_hooks or "_hf_hook" in b.__dict__ for b in layer.lora_B.values())
    return not any(hooked)


@contextmanager
def updates_in_one_matmul(layers: list[LoraLinear]) -> Iterator[None]:
    """Within the block (a forward and its backward), ``layers`` whose ``lora_B`` has no hook add their LoRA update by
    one ``addmm``."""
    layers = [layer for layer in layers if _unhooked(layer)]
    for layer in layers:
        layer.lora_variant.update(dict.fromkeys(layer.lora_A, _OneMatmulUpdate))
    try:
        yield
    finally:
        for layer in layers:
            for adapter in [name for name, variant in layer.lora_variant.items() if variant is _OneMatmulUpdate]:
                del layer.lora_variant[adapter]
