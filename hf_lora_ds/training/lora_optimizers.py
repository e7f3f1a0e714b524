"""LoRA+ and LoRA-FA (``--lora_optimizer``): PEFT's optimizers for A and B at different rates, built where Trainer
builds its own (``create_optimizer``), so DeepSpeed receives them as its client optimizer and FSDP, DDP and one
process use them as they are.

- LoRA+ (``peft.optimizers.create_loraplus_optimizer``): Trainer's optimizer class and settings (``--optim``,
  betas, epsilon), with every lora_B (and 1-D adapter tensor) in groups at ``--loraplus_lr_ratio`` times the
  learning rate of lora_A. The scheduler scales each group from its own rate, so the ratio holds all run long.
- LoRA-FA (``peft.optimizers.create_lorafa_optimizer``): lora_A frozen at its init, lora_B's gradient projected
  through (A·Aᵀ)⁻¹; its own AdamW, which needs each module's whole A and B at every step (refused under ZeRO 1-3 and
  FSDP before loading: hf_lora_ds.model.lora_variants).
"""

from __future__ import annotations

import torch
from peft import PeftModel
from peft.optimizers import create_lorafa_optimizer, create_loraplus_optimizer
from transformers import Trainer, TrainingArguments

from hf_lora_ds.model.lora_variants import DEFAULT_LORAPLUS_RATIO

__all__ = ["create_lora_optimizer"]


def create_lora_optimizer(model: PeftModel, args: TrainingArguments) -> torch.optim.Optimizer:
    """The optimizer ``args.lora_optimizer`` names (``loraplus`` or ``lorafa``) for ``model``'s adapter."""
    if args.lora_optimizer == "lorafa":
        return create_lorafa_optimizer(
            model, r=args.lora_rank, lora_alpha=args.lora_alpha, lr=args.learning_rate, weight_decay=args.weight_decay
        )
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs.pop("lr", None)
    return create_loraplus_optimizer(
        model,
        optimizer_cls,
        lr=args.learning_rate,
        loraplus_lr_ratio=args.loraplus_lr_ratio or DEFAULT_LORAPLUS_RATIO,
        loraplus_weight_decay=args.weight_decay,
        **kwargs,
    )
