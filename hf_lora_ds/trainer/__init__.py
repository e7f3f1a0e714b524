"""``LoraSFTTrainer``: transformers' Trainer with the LoRA adapter, the run's callbacks and its checks attached; the
top of the library, above the training runtime (hf_lora_ds.training) and the callbacks it composes."""

from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer

__all__ = ["LoraSFTTrainer"]
