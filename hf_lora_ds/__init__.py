"""hf_lora_ds: LoRA supervised fine-tuning of chat LLMs with Hugging Face Trainer and DeepSpeed."""

from hf_lora_ds.quiet import quiet_third_party_noise

quiet_third_party_noise()  # first: the imports below bring in PEFT, and PEFT bitsandbytes (see hf_lora_ds.quiet)

from hf_lora_ds.data.collator import build_collator, resolve_batching, supports_padding_free
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, TemplateError
from hf_lora_ds.data.formats import FormatOptions, to_messages
from hf_lora_ds.data.mask_audit import MaskAudit, audit_dataset
from hf_lora_ds.data.records import DataError, load_records
from hf_lora_ds.data.sources import load_data
from hf_lora_ds.launch.arguments import SFTTrainingArguments
from hf_lora_ds.model.lora import lora_config_from_args
from hf_lora_ds.training.trainer import LoraSFTTrainer

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
