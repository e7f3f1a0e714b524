"""hf_lora_ds: LoRA supervised fine-tuning of chat LLMs with Hugging Face Trainer and DeepSpeed.

The public names load on first use (PEP 562), so that ``python -m hf_lora_ds.doctor`` runs, and names a missing
dependency in one line, on a machine where PEFT, datasets or transformers do not import. Importing the package changes
nothing in the importing process; what a command of the package does to its own is hf_lora_ds.command_process's.
"""

from hf_lora_ds._lazy import lazy_names

_EXPORTS = {
    "SFTTrainingArguments": "hf_lora_ds.config",
    "ChatSFTDataset": "hf_lora_ds.data.dataset",
    "LoraSFTTrainer": "hf_lora_ds.trainer.lora_sft_trainer",
    "DataError": "hf_lora_ds.data.records",
    "TemplateError": "hf_lora_ds.data.dataset",
    "IGNORE_INDEX": "hf_lora_ds.data.dataset",
    "MaskAudit": "hf_lora_ds.data.audit",
    "audit_dataset": "hf_lora_ds.data.audit",
    "build_collator": "hf_lora_ds.data.batches",
    "resolve_batching": "hf_lora_ds.config.batching",
    "supports_padding_free": "hf_lora_ds.data.batches",
    "lora_config_from_args": "hf_lora_ds.model.lora",
    "load_records": "hf_lora_ds.data.records",
    "to_messages": "hf_lora_ds.data.formats",
    "FormatOptions": "hf_lora_ds.data.formats",
    "load_data": "hf_lora_ds.data.sources",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
