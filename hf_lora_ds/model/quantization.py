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

from hf_lora_ds.quiet import give_peft_bitsandbytes

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig

    from hf_lora_ds.launch.arguments import SFTTrainingArguments

__all__ = ["quantization_config_from_args", "quantized_load_kwargs", "prepare_quantized_model", "quantized_layers_line"]


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

    give_peft_bitsandbytes()  # PEFT was imported without it (hf_lora_ds.quiet); the quantized load imported it

    return prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs or {"use_reentrant": False},
    )


def quantized_layers_line(model: torch.nn.Module) -> str | None:
    """What was quantized, counted on the loaded model (not read from the flags): a load that silently fell back to
    full precision would show 0 layers here. None for a full-precision base."""
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
    return f"quantized base: {len(layers)} {layers[0] if layers else 'bitsandbytes'} layers ({kind})"
