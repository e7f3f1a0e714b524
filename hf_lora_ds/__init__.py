"""hf_lora_ds: LoRA supervised fine-tuning of chat LLMs with Hugging Face Trainer and DeepSpeed.

The public names load on first use (PEP 562), so that ``python -m hf_lora_ds.doctor`` runs, and names a missing
dependency in one line, on a machine where PEFT, datasets or transformers do not import.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any

from hf_lora_ds.quiet import quiet_third_party_noise


@contextmanager
def _imports_kept_from_the_collector() -> Iterator[None]:
    """The cyclic garbage collector off inside; afterwards every object alive is frozen (``gc.freeze``) and the
    collector is back as it was. Importing torch, transformers and PEFT makes ~450k objects that live as long as the
    process and almost no garbage, yet their allocations trigger full collections, and every later full collection
    (Trainer runs one as training starts) would walk them again: about a fifth of each rank's and each CLI's import
    time (bench/startup.py). The collection first: garbage made before this import is freed, not frozen."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


with _imports_kept_from_the_collector():
    quiet_third_party_noise()  # first: the package's modules bring in PEFT, and PEFT bitsandbytes (see .quiet)

_EXPORTS = {
    "SFTTrainingArguments": "hf_lora_ds.config",
    "ChatSFTDataset": "hf_lora_ds.data.dataset",
    "LoraSFTTrainer": "hf_lora_ds.trainer.lora_sft_trainer",
    "DataError": "hf_lora_ds.data.records",
    "TemplateError": "hf_lora_ds.data.dataset",
    "IGNORE_INDEX": "hf_lora_ds.data.dataset",
    "MaskAudit": "hf_lora_ds.data.mask_audit",
    "audit_dataset": "hf_lora_ds.data.mask_audit",
    "build_collator": "hf_lora_ds.data.collator",
    "resolve_batching": "hf_lora_ds.config.batching",
    "supports_padding_free": "hf_lora_ds.data.collator",
    "lora_config_from_args": "hf_lora_ds.model.lora",
    "load_records": "hf_lora_ds.data.records",
    "to_messages": "hf_lora_ds.data.formats",
    "FormatOptions": "hf_lora_ds.data.formats",
    "load_data": "hf_lora_ds.data.sources",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_lora_ds' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
