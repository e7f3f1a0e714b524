"""What a run loads of its model, from its arguments: the tokenizer, the base model and, for what reads no weights
(the audit's LoRA coverage, the memory planner), the base's config; ``--model_name_or_path`` names a hub id, a
directory or a GGUF file, quantized or not. Each function carries the flags that shape it, so run_sft, the audit and
the planner read the same model the same way. A vision-language checkpoint loads with its vision tower and projector
(transformers' image-text-to-text class), a text one as a causal LM."""

from __future__ import annotations

from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
)

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.batching import VARLEN_ATTENTION
from hf_lora_ds.model.experts_kernel import choose_experts_implementation, use_experts_kernel
from hf_lora_ds.model.gguf_import import gguf_config, model_source, plain_model
from hf_lora_ds.model.quantization import prepare_quantized_model, quantized_layers_line, quantized_load_kwargs
from hf_lora_ds.model.source import hub_load_errors, load_model_config
from hf_lora_ds.model.varlen_attention import register_varlen_attention
from hf_lora_ds.vision.modules import auto_model_class
from hf_lora_ds.vision.processor import load_processor

__all__ = ["base_model_config", "load_base_model", "load_run_processor", "load_tokenizer"]


def load_tokenizer(args: SFTTrainingArguments, need_weights: bool = True) -> PreTrainedTokenizerBase:
    """The base model's tokenizer and chat template (from a GGUF file's metadata when the base is one). A base
    without weights is refused here, before any data is tokenized, unless ``need_weights`` is False (the audit and
    the planner read none)."""
    source, source_kwargs = model_source(args.model_name_or_path, args.gguf_file, need_weights=need_weights)
    with hub_load_errors(args.model_name_or_path):
        return AutoTokenizer.from_pretrained(source, trust_remote_code=args.trust_remote_code, **source_kwargs)


def load_run_processor(args: SFTTrainingArguments) -> ProcessorMixin | None:
    """A vision-language base's processor (its tokenizer inside), None for a text-only base or a GGUF file."""
    if args.gguf_file or str(args.model_name_or_path).endswith(".gguf"):
        return None
    with hub_load_errors(args.model_name_or_path):
        return load_processor(args.model_name_or_path)


def load_base_model(args: SFTTrainingArguments) -> tuple[PreTrainedModel, str | None]:
    """The base in the run's dtype, attention and experts kernels, quantized and prepared for k-bit training when
    asked, and the line saying which layers are quantized (None for a full-precision base). Under ZeRO-3 the
    arguments were built first, so ``from_pretrained`` partitions the weights as it loads them."""
    experts_kernel = choose_experts_implementation(args.experts_implementation, args.device, args.torch_dtype)
    source, source_kwargs = model_source(args.model_name_or_path, args.gguf_file)
    with hub_load_errors(args.model_name_or_path):
        config = AutoConfig.from_pretrained(source, trust_remote_code=args.trust_remote_code, **source_kwargs)
        if args.attn_implementation == VARLEN_ATTENTION:
            register_varlen_attention(config)
        model = auto_model_class(config).from_pretrained(
            source,
            dtype=args.torch_dtype,
            attn_implementation=args.attn_implementation,
            trust_remote_code=args.trust_remote_code,
            **quantized_load_kwargs(args),
            **source_kwargs,
        )
        model = prepare_quantized_model(plain_model(model), args)
    use_experts_kernel(model, experts_kernel)
    return model, quantized_layers_line(model)


def base_model_config(args: SFTTrainingArguments) -> PretrainedConfig:
    """The base's config without reading a weight: a GGUF file's metadata, a directory's (or a ``config.json``'s),
    a hub id's, or the shipped config of a hub id whose architecture numbers ship with the package."""
    return gguf_config(args.model_name_or_path, args.gguf_file) or load_model_config(
        args.model_name_or_path, args.trust_remote_code
    )
