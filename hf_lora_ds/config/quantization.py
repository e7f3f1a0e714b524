"""The quantized base's fields (QLoRA with bitsandbytes) and the combinations refused from them alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["QuantizationArguments", "check_quantization_fields", "quantization_flag"]


@dataclass
class QuantizationArguments:
    """Load the base in 4 or 8 bits; LoRA trains on top."""

    load_in_4bit: bool = field(
        default=False,
        metadata={
            "help": "QLoRA: load the base in 4 bits with bitsandbytes (~1/4 of bf16 memory); LoRA trains on top."
        },
    )
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = field(
        default="nf4", metadata={"help": "4-bit data type: 'nf4' (NormalFloat, the QLoRA paper's) or 'fp4'."}
    )
    bnb_4bit_use_double_quant: bool = field(
        default=True, metadata={"help": "Quantize the 4-bit scales too (~0.4 bits/weight less, same accuracy)."}
    )
    load_in_8bit: bool = field(
        default=False, metadata={"help": "Load the base in 8 bits (LLM.int8) with bitsandbytes: ~1/2 of bf16 memory."}
    )


def check_quantization_fields(args: SFTTrainingArguments) -> None:
    """Combinations that fail with a bitsandbytes base, refused before loading (``args`` also carries ``fsdp``)."""
    if not (args.load_in_4bit or args.load_in_8bit):
        return
    if args.load_in_4bit and args.load_in_8bit:
        raise UserError("--load_in_4bit and --load_in_8bit: choose one")
    if args.fsdp:
        # FSDP2's fully_shard needs every parameter as a plain tensor it can split into DTensor shards; the
        # bitsandbytes Params4bit/Int8Params subclasses and their quantization state do not survive that.
        raise UserError(
            f"{quantization_flag(args)} with FSDP: bitsandbytes' quantized weights cannot be sharded by "
            "FSDP2's fully_shard; use DeepSpeed ZeRO-3 (--deepspeed stage3) for a sharded QLoRA run"
        )


def quantization_flag(args: SFTTrainingArguments) -> str:
    """The flag that quantizes the base, for messages."""
    return "--load_in_4bit" if args.load_in_4bit else "--load_in_8bit"
