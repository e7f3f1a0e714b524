"""LoRA layers' inputs left in the compute dtype while a training step autocasts on an accelerator.

PEFT casts each adapted layer's input to its adapters' dtype (fp32 under a 16-bit base, ``autocast_adapter_dtype``);
under autocast the adapters' matmuls cast it straight back to 16 bits. That round trip changes no value the
matmuls see and costs two casts an adapted layer in forward and two in backward (~640 ops a step on Qwen2.5-0.5B),
and without dropout a second 16-bit copy of the input kept for backward. Around a training step that autocasts on an
accelerator, the plain LoRA layers take their input as it comes; the planner's meta forward does the same
(hf_lora_ds.plan.model_shape). Not on a CPU: its dropout scales a 16-bit input in 16 bits (CUDA's fused kernel in
fp32, rounding once, as after PEFT's cast), and 16-bit CPU runs are not the fast path anyway. Outside the step
(generation, a user's own forward without autocast) PEFT's cast is back. PEFT's own ``disable_input_dtype_casting``
walks every module at each entry and exit and takes in the variants too: the layers here are listed once a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft.tuners.lora import Linear as LoraLinear

__all__ = ["inputs_as_they_come", "uncast_lora_layers", "uncast_in_training"]


def uncast_lora_layers(model: torch.nn.Module) -> list[LoraLinear]:
    """The plain LoRA linear layers whose adapters are held in another dtype than their base weight. Variants (DoRA
    and the others) compute on the cast input beyond the adapters' matmuls and keep PEFT's cast."""
    return [
        module
        for module in model.modules()
        if isinstance(module, LoraLinear)
        and not module.lora_variant
        and any(lora_a.weight.dtype != module.base_layer.weight.dtype for lora_a in module.lora_A.values())
    ]


def uncast_in_training(model: torch.nn.Module, autocasts: bool, on_accelerator: bool) -> list[LoraLinear]:
    """The layers a training step runs with their inputs uncast: none unless it autocasts on an accelerator."""
    return uncast_lora_layers(model) if autocasts and on_accelerator else []


@contextmanager
def inputs_as_they_come(layers: list[LoraLinear]) -> Iterator[None]:
    """Within the block, ``layers`` skip PEFT's cast of their input to the adapters' dtype (for a forward and
    backward under autocast only: without it the matmuls would meet two dtypes)."""
    previous = [getattr(layer, "cast_input_dtype_enabled", True) for layer in layers]
    for layer in layers:
        layer.cast_input_dtype_enabled = False
    try:
        yield
    finally:
        for layer, enabled in zip(layers, previous):
            layer.cast_input_dtype_enabled = enabled
