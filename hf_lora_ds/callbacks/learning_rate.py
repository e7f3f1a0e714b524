"""The highest learning rate the run's optimizer steps used: the adapter check's measure of whether a run
that left its adapter untouched could have moved it (hf_lora_ds.model.adapter_check)."""

from __future__ import annotations

from transformers import TrainerCallback

__all__ = ["LearningRateWatch"]


class LearningRateWatch(TrainerCallback):
    """The highest learning rate any optimizer step of this run used, read as each step begins."""

    def __init__(self) -> None:
        self.max_learning_rate = 0.0

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        if optimizer is not None:
            rates = [group["lr"] for group in optimizer.param_groups]
            self.max_learning_rate = max(self.max_learning_rate, *rates)
