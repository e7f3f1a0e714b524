"""hf_lora_ds: LoRA supervised fine-tuning of chat LLMs with Hugging Face Trainer and DeepSpeed."""

from hf_lora_ds.arguments import SFTTrainingArguments
from hf_lora_ds.audit import MaskAudit, audit_dataset
from hf_lora_ds.collator import build_collator, resolve_batching, supports_padding_free
from hf_lora_ds.data import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.formats import FormatOptions, to_messages
from hf_lora_ds.lora import lora_config_from_args
from hf_lora_ds.records import DataError, load_records
from hf_lora_ds.sources import load_data
from hf_lora_ds.trainer import LoraSFTTrainer

__all__ = [
    "SFTTrainingArguments",
    "ChatSFTDataset",
    "LoraSFTTrainer",
    "DataError",
    "TemplateError",
    "IGNORE_INDEX",
    "MaskAudit",
    "audit_dataset",
    "build_collator",
    "resolve_batching",
    "supports_padding_free",
    "lora_config_from_args",
    "load_records",
    "to_messages",
    "FormatOptions",
    "load_data",
]
