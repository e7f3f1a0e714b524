"""The run's configuration, the lowest layer above the core modules: the fields of ``SFTTrainingArguments`` by
concern (model, quantization, data, LoRA, engine, memory plan, reliability, reporting) with the checks that need
their values only, and the readers of a DeepSpeed or FSDP config. Nothing here imports the rest of the package."""

from hf_lora_ds.config.arguments import SFTTrainingArguments

__all__ = ["SFTTrainingArguments"]
