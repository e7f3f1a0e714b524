"""The ``kernels:`` line: which kernels a run's step uses, read from the live objects once Trainer has built the
optimizer and wrapped the model, printed on rank 0 beside the ``engine:`` line (hf_lora_ds.callbacks.engine_line).

``kernels: attention sdpa, padded; LoRA update addmm; loss fused chunked LM head; optimizer AdamW fused;
torch.compile off``: the attention kernel the model was loaded with and how rows are batched, how the LoRA layers add
their update in a step (one ``addmm`` or PEFT's form: hf_lora_ds.training.lora_update), the head the loss comes from
(the trainer's choice: hf_lora_ds.training.loss_head), Liger's kernels where ``--use_liger_kernel`` put them in,
the optimizer's implementation, and whether the decoder layers are compiled (hf_lora_ds.training.compile). The
doctor prints the same words for a default run on its machine.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer

from hf_lora_ds.training.compile import compiled_layer_count
from hf_lora_ds.training.liger import liger_ops
from hf_lora_ds.training.loss_head import loss_head

__all__ = ["kernels_line", "kernels_record", "optimizer_kind"]


def kernels_record(trainer: Trainer) -> dict[str, Any]:
    """The kernels as the live model, collator choice and optimizer report them."""
    compiled = compiled_layer_count(trainer.model)
    return {
        "attention": trainer.model.config._attn_implementation,
        "batching": trainer.args.batching.replace("_", "-"),
        "lora_update": "addmm" if trainer.one_matmul_layers else "PEFT's",
        "loss": loss_head(trainer),
        "liger": liger_ops(trainer.args),
        "optimizer": optimizer_kind(trainer.optimizer),
        "compile": f"regional ({compiled} layers)" if compiled else "off",
    }


def kernels_line(record: dict[str, Any]) -> str:
    """``kernels: attention sdpa, padded; LoRA update addmm; loss fused chunked LM head; optimizer AdamW fused;
    torch.compile off``."""
    parts = [
        f"attention {record['attention']}, {record['batching']}",
        f"LoRA update {record['lora_update']}",
        f"loss {record['loss']}",
        *([f"Liger {', '.join(record['liger'])}"] if record["liger"] else []),
        f"optimizer {record['optimizer']}",
        f"torch.compile {record['compile']}",
    ]
    return "kernels: " + "; ".join(parts)


def optimizer_kind(optimizer: Any) -> str:
    """``AdamW fused`` / ``AdamW foreach`` / ``AdamW for-loop`` for torch's optimizers, ``FusedAdam (DeepSpeed)``
    for DeepSpeed's own; the optimizer that updates the weights, under accelerate's and ZeRO's wrappers."""
    while hasattr(optimizer, "optimizer") and optimizer.optimizer is not optimizer:
        optimizer = optimizer.optimizer
    name = type(optimizer).__name__
    if type(optimizer).__module__.startswith("deepspeed"):
        return f"{name} (DeepSpeed)"
    defaults = getattr(optimizer, "defaults", {})
    if "fused" not in defaults and "foreach" not in defaults:  # one that has no such choice (LoRA-FA's)
        return name
    if defaults.get("fused"):
        return f"{name} fused"
    # foreach None: torch takes foreach for CUDA tensors and the for-loop otherwise
    on_cuda = any(p.is_cuda for group in optimizer.param_groups for p in group["params"])
    return (
        f"{name} foreach"
        if defaults.get("foreach") or (defaults.get("foreach") is None and on_cuda)
        else f"{name} for-loop"
    )
