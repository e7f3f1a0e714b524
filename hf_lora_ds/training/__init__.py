"""The training runtime around transformers' Trainer: ``trainer`` (``LoraSFTTrainer``), the loss from the supervised
positions only (``supervised_logits``, ``fused_head_loss``), the non-finite guard (``nonfinite``), checkpoints that
resume safely (``checkpoints``, ``universal_checkpoint``), FSDP2's gaps (``fsdp2``) and the memory tracker
(``memory_tracker``). The TrainerCallbacks built on them live in hf_lora_ds.callbacks."""
