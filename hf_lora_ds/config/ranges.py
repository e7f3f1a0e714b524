"""The numeric TrainingArguments flags that transformers takes as they are and fails on later (or silently
ignores): each with the range it must be in, checked before any model is loaded."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["RANGES", "check_ranges"]

_SEED_MAX = 2**32 - 1


def _at_least(low: float) -> tuple[Callable[[float], bool], str]:
    return (lambda value: value >= low), f"at least {low:g}"


_POSITIVE = ((lambda value: value > 0), "positive")
_UNIT = ((lambda value: 0 <= value < 1), "in [0, 1)")
_SEED = ((lambda value: 0 <= value <= _SEED_MAX), f"in [0, {_SEED_MAX}]")


# flag -> (holds, what the flag must be); None (unset) always passes.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "per_device_train_batch_size": _at_least(1),
    "per_device_eval_batch_size": _at_least(1),
    "gradient_accumulation_steps": _at_least(1),
    "eval_accumulation_steps": _at_least(1),
    "num_train_epochs": _POSITIVE,
    "max_steps": ((lambda value: value == -1 or value >= 1), "-1 (train for --num_train_epochs) or at least 1"),
    "learning_rate": _at_least(0),
    "weight_decay": _at_least(0),
    "adam_beta1": _UNIT,
    "adam_beta2": _UNIT,
    "adam_epsilon": _at_least(0),
    "max_grad_norm": _at_least(0),
    "label_smoothing_factor": _UNIT,
    "neftune_noise_alpha": _POSITIVE,
    "logging_steps": _POSITIVE,
    "eval_steps": _POSITIVE,
    "save_steps": _POSITIVE,
    "eval_delay": _at_least(0),
    "save_total_limit": _at_least(1),
    "seed": _SEED,
    "data_seed": _SEED,
    "dataloader_num_workers": _at_least(0),
    "ddp_bucket_cap_mb": _at_least(1),
    "ddp_timeout": _at_least(1),
}


def check_ranges(args: SFTTrainingArguments) -> None:
    """Raise a ``UserError`` naming the first flag whose value is out of its range (or not a finite number)."""
    for name, (holds, wanted) in RANGES.items():
        value = getattr(args, name)
        if value is None:
            continue
        if not math.isfinite(value) or not holds(value):
            raise UserError(f"--{name} must be {wanted}, got {value}")
