"""The base model's fields: which model, its dtype, its attention and experts kernels, a GGUF file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["ModelArguments", "check_model_fields"]


@dataclass
class ModelArguments:
    """The base model to adapt and how its weights are loaded."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Base model: a local directory or a hub id (any causal LM with a chat template)."},
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={
            "help": "Dtype to load the base weights in. 'auto': bfloat16 on a GPU that supports it (and bf16 "
            "training), float32 elsewhere (bf16 matmuls are slow on CPUs)."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow the model's own Python code from its repository to run. Off by default."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel: 'sdpa', 'eager', 'flash_attention_2' or 'varlen_attn' (torch's own "
            "FlashAttention-2 varlen kernel, no flash_attn install: CUDA in bf16/fp16, padding-free or packed "
            "batches, text models). None: transformers' pick."
        },
    )
    experts_implementation: Literal["auto", "grouped_mm", "batched_mm", "eager"] = field(
        default="auto",
        metadata={
            "help": "Mixture-of-Experts models: the routed experts' kernel (transformers' experts_implementation). "
            "auto: grouped_mm (torch's grouped GEMM) where it runs forward and backward on the device in the "
            "run's dtype, else eager (a loop over the experts). batched_mm gathers each token's expert weights: "
            "memory grows with tokens x top-k, small models only."
        },
    )
    gguf_file: str | None = field(
        default=None,
        metadata={
            "help": "A GGUF base (llama.cpp, Ollama): the file's name inside --model_name_or_path DIR (or pass the "
            ".gguf path as --model_name_or_path). Loaded dequantized to --dtype, with its tokenizer and chat "
            "template; needs the gguf package (pip install 'hf_lora_ds[gguf]')."
        },
    )


def check_model_fields(args: SFTTrainingArguments) -> None:
    """A weights dtype that agrees with the mixed precision flags (``args`` also carries TrainingArguments'
    ``bf16``/``fp16``)."""
    if args.dtype == "bfloat16" and args.fp16:
        raise UserError("--dtype bfloat16 with --fp16: use --bf16 (or --dtype float16 with --fp16)")
    if args.dtype == "float16" and args.bf16:
        raise UserError("--dtype float16 with --bf16: use --fp16 (or --dtype bfloat16 with --bf16)")
