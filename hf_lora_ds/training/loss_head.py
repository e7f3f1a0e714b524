"""Which LM head computes a ``LoraSFTTrainer``'s loss: the fused chunked head (no logits), the head at the supervised
positions only, Liger's fused linear cross-entropy, or full logits; and why full logits where they are."""

from __future__ import annotations

from transformers import Trainer

from hf_lora_ds.training.liger import liger_ops
from hf_lora_ds.training.supervised_logits import fused_head

__all__ = ["FULL_LOGITS", "FUSED_HEAD", "LIGER_HEAD", "SUPERVISED_ROWS", "full_logits_reason", "loss_head"]

FUSED_HEAD = "fused chunked LM head"
SUPERVISED_ROWS = "supervised-position logits"
LIGER_HEAD = "Liger fused linear cross-entropy"
FULL_LOGITS = "full logits"


def full_logits_reason(trainer: Trainer) -> str | None:
    """Why the loss must come from full logits here, or None when the supervised-position loss applies."""
    args = trainer.args
    if not args.supervised_logits_only:
        return "--supervised_logits_only False"
    if _liger_head(args):
        # Liger replaces the forward with one that fuses head and loss in chunks: no full logits either way.
        return "--use_liger_kernel's fused linear cross-entropy computes the loss without full logits"
    if trainer.label_smoother is not None or trainer.compute_loss_func is not None:
        return "label smoothing or compute_loss_func computes its own loss from the logits"
    if not trainer._position_mask and fused_head(trainer.model) is None:
        return (
            f"{type(trainer.model.get_base_model()).__name__}.forward takes no boolean logits_to_keep mask and "
            "its LM head is not a plain bias-free nn.Linear"
        )
    return None


def loss_head(trainer: Trainer) -> str:
    """The head the training loss comes from, in the ``kernels:`` line's words; the fused head as long as no forward
    has shown the model changes the head's output (the trainer then falls back for the rest of the run)."""
    if _liger_head(trainer.args):
        return LIGER_HEAD
    if not trainer.supervised_logits_only:
        return FULL_LOGITS
    fused = fused_head(trainer.model) is not None and trainer._fused_head_loss is not False
    return FUSED_HEAD if fused else SUPERVISED_ROWS


def _liger_head(args) -> bool:
    return "fused_linear_cross_entropy" in liger_ops(args)
