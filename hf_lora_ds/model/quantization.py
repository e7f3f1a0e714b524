"""QLoRA: the base model loaded in 4 or 8 bits through bitsandbytes, with LoRA trained in the compute dtype on top.

Quantization only changes how the base is loaded (``from_pretrained(quantization_config=...)``) and how it is
prepared for training (``peft.prepare_model_for_kbit_training``); the adapter, Trainer, DeepSpeed and the eval are
the same as for a full-precision base. bitsandbytes is an optional dependency (``pip install -e ".[qlora]"``) and is
imported only when a quantized load is asked for.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.model.experts import moe_blocks

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import BitsAndBytesConfig


__all__ = [
    "fit_loftq",
    "quantization_config_from_args",
    "quantized_load_kwargs",
    "prepare_quantized_model",
    "quantized_layers_line",
]


def quantization_config_from_args(args: SFTTrainingArguments) -> BitsAndBytesConfig | None:
    """None for a full-precision base. 4-bit: the compute dtype follows the training dtype (``--dtype``), and the
    packed weights are stored in that dtype too, so that ZeRO-3 (which partitions floating-point tensors only) can
    shard them like any other weight."""
    if not (args.load_in_4bit or args.load_in_8bit):
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError('--load_in_4bit/--load_in_8bit need bitsandbytes: pip install -e ".[qlora]"')
    from transformers import BitsAndBytesConfig

    if args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=args.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=args.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=args.torch_dtype,
        bnb_4bit_quant_storage=args.torch_dtype,
    )


def quantized_load_kwargs(args: SFTTrainingArguments) -> dict:
    """Extra ``from_pretrained`` arguments for a quantized base: the config, and the one device this rank trains
    on (bitsandbytes quantizes while loading, so the weights must land there, not be moved afterwards). Under
    ZeRO-3 there is no device map: DeepSpeed places the partitions itself."""
    config = quantization_config_from_args(args)
    if config is None:
        return {}
    from transformers.integrations import is_deepspeed_zero3_enabled

    kwargs = {"quantization_config": config}
    if not is_deepspeed_zero3_enabled():
        kwargs["device_map"] = {"": str(args.device)}
    return kwargs


def prepare_quantized_model(model: torch.nn.Module, args: SFTTrainingArguments) -> torch.nn.Module:
    """PEFT's preparation for k-bit training (frozen base, inputs that require grad so gradient checkpointing
    reaches the adapters), with Trainer's own checkpointing settings so it is switched on only when asked for.
    A full-precision base is returned unchanged."""
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        return model
    from peft import prepare_model_for_kbit_training

    _give_peft_bitsandbytes()

    return prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs or {"use_reentrant": False},
    )


def quantized_layers_line(model: torch.nn.Module) -> str | None:
    """What was quantized, counted on the loaded model (not read from the flags): a load that silently fell back to
    full precision would show 0 layers here. None for a full-precision base. bitsandbytes quantizes Linear layers
    only: a MoE model's fused 3-D expert weights, most of its parameters, stay as loaded, which the line says."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return None
    config = quantizer.quantization_config
    quantized = ("Linear4bit", "Linear8bitLt")
    layers = [type(module).__name__ for module in model.modules() if type(module).__name__ in quantized]
    if config.load_in_4bit:
        kind = f"4-bit {config.bnb_4bit_quant_type}" + (", double quant" if config.bnb_4bit_use_double_quant else "")
        kind += f", compute {str(config.bnb_4bit_compute_dtype).removeprefix('torch.')}"
    else:
        kind = "8-bit LLM.int8"
    line = f"quantized base: {len(layers)} {layers[0] if layers else 'bitsandbytes'} layers ({kind})"
    stacks = [getattr(model.get_submodule(b.experts), name) for b in moe_blocks(model) for name in b.fused]
    if stacks:
        count = sum(getattr(stack, "ds_numel", stack.numel()) for stack in stacks)  # ZeRO-3 leaves a local shard
        line += (
            f"; the fused expert weights are not ({count:,} parameters stay "
            f"{str(stacks[0].dtype).removeprefix('torch.')}): bitsandbytes quantizes Linear layers only"
        )
    return line


@torch.no_grad()
def fit_loftq(model: PeftModel, weights_path: str | None) -> int:
    """LoftQ on a 4-bit base: each adapted 4-bit layer's A and B become the rank-r SVD of its quantisation error,
    the full-precision weight (read from the base's safetensors at ``weights_path``; None: the Hub cache of the
    model's name) minus the 4-bit one, divided by LoRA's scaling so that the adapter adds exactly that. The model
    then starts at the full-precision weights, up to what rank r cannot hold. Returns the layers fitted.

    PEFT's ``replace_lora_weights_loftq`` does the same fit, but on a CUDA device only and without the scaling
    (right only when lora_alpha equals r). Under ZeRO-3 each packed weight is gathered for its own fit."""
    from bitsandbytes.functional import dequantize_4bit
    from peft.tuners.lora.bnb import Linear4bit
    from peft.utils.integrations import gather_params_ctx
    from peft.utils.loftq_utils import _SafetensorLoader  # the base's (sharded) safetensors by module name

    weights = _SafetensorLoader(model, weights_path)
    adapter = model.active_adapter
    fitted = 0
    for name, module in model.named_modules():
        if not isinstance(module, Linear4bit) or adapter not in module.lora_A:
            continue
        full = weights.get_tensor(name.removeprefix("base_model.model.") + ".weight").to(torch.float32)
        packed = module.get_base_layer().weight
        with gather_params_ctx(packed, modifier_rank=None):
            error = full - dequantize_4bit(packed.data, packed.quant_state).to(torch.float32).reshape(full.shape)
        u, singular, vh = torch.linalg.svd(error, full_matrices=False)
        rank = module.r[adapter]
        root = (singular[:rank] / module.scaling[adapter]).sqrt()
        lora_a, lora_b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
        lora_a.data = (root[:, None] * vh[:rank]).to(lora_a.dtype).contiguous()
        lora_b.data = (u[:, :rank] * root).to(lora_b.dtype).contiguous()
        fitted += 1
    return fitted


def _give_peft_bitsandbytes() -> None:
    """A command imports PEFT with bitsandbytes hidden (hf_lora_ds.command_process): hand the one the quantized load
    has now imported to the PEFT helper that was imported without it."""
    import bitsandbytes
    import peft.helpers

    if getattr(peft.helpers, "bnb", bitsandbytes) is None:
        peft.helpers.bnb = bitsandbytes
