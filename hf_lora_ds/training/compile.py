"""``--torch_compile`` as regional compilation: each repeated decoder layer compiled in place, the rest eager.

Trainer hands accelerate a TorchDynamoPlugin that ``torch.compile``s the whole PeftModel: one graph with LoRA's
per-module branches, compiled from scratch for the whole depth, under a wrapper whose ``_orig_mod.`` names the
adapter's saving and the fused LM head would have to see through. Compiling each layer in place (``Module.compile``,
what accelerate's ``compile_regions_deepspeed`` does) compiles one layer's graph and reuses it for the other layers of
its class, and leaves the module tree, its names and its head as they are. Accelerate's own compile is switched off
for the run (``without_whole_model_compile``), which also keeps it from turning TF32 on for the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import TorchDynamoPlugin
from accelerate.utils.other import is_repeated_blocks
from transformers import TrainingArguments

from hf_lora_ds.errors import UserError

__all__ = ["check_torch_compile", "compiled_layer_count", "compiled_regions", "without_whole_model_compile"]


def check_torch_compile(args: TrainingArguments) -> None:
    """Refuse ``--torch_compile`` with the engines whose hooks run inside every layer's forward: ZeRO-3 gathers each
    layer's parameters and FSDP2 unshards them there, which dynamo cannot trace into one graph."""
    if not args.torch_compile:
        return
    engine = args.engine
    if engine.kind == "fsdp":
        raise UserError("--torch_compile with FSDP: not supported here (FSDP2 unshards inside each layer); drop one")
    if engine.kind == "deepspeed" and engine.zero.stage == 3:
        raise UserError(
            "--torch_compile with DeepSpeed ZeRO-3: not supported here (ZeRO-3 gathers parameters inside each "
            "layer); use --deepspeed stage2 or drop --torch_compile"
        )


def without_whole_model_compile(accelerator_args: dict[str, Any]) -> dict[str, Any]:
    """Trainer's accelerator arguments with accelerate's compile of the whole model off (``compiled_regions``
    compiles the layers instead)."""
    if "dynamo_plugin" in accelerator_args:
        accelerator_args["dynamo_plugin"] = TorchDynamoPlugin(backend="no")
    return accelerator_args


@contextmanager
def compiled_regions(model: torch.nn.Module, args: TrainingArguments) -> Iterator[None]:
    """Within the block, each repeated layer of ``model`` is compiled in place with ``--torch_compile_backend`` and
    ``--torch_compile_mode``; after it the model runs eagerly again (it is the caller's model)."""
    layers = _repeated_layers(model)
    for layer in layers:
        layer.compile(backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode)
    try:
        yield
    finally:
        for layer in layers:
            layer._compiled_call_impl = None  # what Module.__init__ sets: the eager call


def compiled_layer_count(model: torch.nn.Module) -> int:
    """How many modules of ``model`` are compiled in place."""
    return sum(getattr(module, "_compiled_call_impl", None) is not None for module in model.modules())


def _repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of each outermost ModuleList of one class (accelerate's test for repeated blocks): the decoder's
    layers, a vision tower's blocks; not the experts inside a layer."""
    layers: list[torch.nn.Module] = []
    outer: list[str] = []
    for name, module in model.named_modules():
        if is_repeated_blocks(module) and not any(name.startswith(f"{prefix}.") for prefix in outer):
            outer.append(name)
            layers.extend(module)
    return layers
