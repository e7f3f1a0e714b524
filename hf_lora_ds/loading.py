"""What a run loads, from its arguments: the tokenizer and base model ``--model_name_or_path`` names (a hub id, a
directory or a GGUF file; quantized or not), its data and the tokenized datasets. run_sft reads as the order of
these calls; each of them carries the flags that shape it, so that order stays readable."""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from hf_lora_ds.data import ChatSFTDataset
from hf_lora_ds.gguf_source import model_source, plain_model
from hf_lora_ds.model_source import hub_load_errors
from hf_lora_ds.quantization import prepare_quantized_model, quantized_layers_line, quantized_load_kwargs
from hf_lora_ds.sources import LoadedData, load_data

__all__ = ["load_base_model", "load_run_data", "load_tokenizer", "sft_dataset"]


def load_tokenizer(args: Any) -> PreTrainedTokenizerBase:
    """The base model's tokenizer and chat template (from a GGUF file's metadata when the base is one)."""
    source, source_kwargs = model_source(args.model_name_or_path, args.gguf_file)
    with hub_load_errors(args.model_name_or_path):
        return AutoTokenizer.from_pretrained(source, trust_remote_code=args.trust_remote_code, **source_kwargs)


def load_base_model(args: Any) -> tuple[PreTrainedModel, str | None]:
    """The base in the run's dtype and attention kernel, quantized and prepared for k-bit training when asked, and
    the line saying which layers are quantized (None for a full-precision base). Under ZeRO-3 the arguments were
    built first, so ``from_pretrained`` partitions the weights as it loads them."""
    source, source_kwargs = model_source(args.model_name_or_path, args.gguf_file)
    with hub_load_errors(args.model_name_or_path):
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=args.torch_dtype,
            attn_implementation=args.attn_implementation,
            trust_remote_code=args.trust_remote_code,
            **quantized_load_kwargs(args),
            **source_kwargs,
        )
        model = prepare_quantized_model(plain_model(model), args)
    return model, quantized_layers_line(model)


def load_run_data(spec: str, args: Any) -> LoadedData:
    """``--train_file``/``--eval_file`` records, mixed with the run's seed and cached where the run caches data."""
    return load_data(spec, seed=args.seed, trust_remote_code=args.trust_remote_code, cache_dir=args.dataset_cache_dir)


def sft_dataset(data: LoadedData, tokenizer: PreTrainedTokenizerBase, args: Any) -> ChatSFTDataset:
    """The records tokenized with exact label masks, as the run's data flags ask."""
    return ChatSFTDataset(data, tokenizer, max_length=args.max_length, system_prompt=args.system_prompt,
                          assistant_turns=args.assistant_turns, on_empty_labels=args.on_empty_labels,
                          cache_dir=args.dataset_cache_dir, formats=args.format_options,
                          num_proc=args.preprocessing_num_workers, thinking=args.thinking_options)  # fmt: skip
