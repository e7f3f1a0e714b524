"""A run that diverges without ever producing a NaN, reported on one line with its step (``--on_divergence``).

The non-finite guard (hf_lora_ds.training.nonfinite) misses a too-high learning rate that leaves the loss large but
finite or every gradient exactly 0 (the demo at ``--learning_rate 1e6`` ended with exit 0 and accuracy 0). Two signs,
read from each log: the loss ``LOSS_FACTOR`` times over the running median, and a zero gradient norm after non-zero
ones. ``warn`` prints the first of each on rank 0, ``stop`` raises ``DivergenceError``; the step is recorded either way
(``divergence_step``).
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.utils import logging

from hf_lora_ds.errors import UserError
from hf_lora_ds.training.checkpoints import find_latest_complete_checkpoint

__all__ = ["DivergenceCallback", "DivergenceError", "LOSS_FACTOR", "MIN_HISTORY"]

logger = logging.get_logger(__name__)

LOSS_FACTOR = 3.0
MIN_HISTORY = 1  # at --learning_rate 3 the demo's loss went 4.3 -> 17.8 at step 2, then fell back


class DivergenceError(UserError):
    """The training loss or gradient norm showed the run diverging (with ``--on_divergence stop``)."""


class DivergenceCallback(TrainerCallback):
    """Watches ``loss`` and ``grad_norm`` in each training log; ``mode`` is ``--on_divergence``."""

    def __init__(self, mode: Literal["warn", "stop"] = "warn"):
        self.mode = mode
        self.losses: list[float] = []
        self.nonzero_grad_seen = False
        self.reported: set[str] = set()

    def sign(self, loss: float | None, grad_norm: float | None) -> tuple[str, str] | None:
        """``(kind, description)`` of the divergence these values show, or None; updates the history."""
        found = None
        if loss is not None and math.isfinite(loss):  # NaN/inf: the non-finite guard's (a skipped step's loss)
            if len(self.losses) >= MIN_HISTORY and loss > LOSS_FACTOR * (median := statistics.median(self.losses)):
                found = ("loss", f"training loss {loss:.4g} is over {LOSS_FACTOR:g}x its running median {median:.4g}")
            self.losses.append(loss)
        if grad_norm is not None:
            if grad_norm == 0 and self.nonzero_grad_seen and found is None:
                found = ("grad_norm", "gradient norm is exactly 0 after non-zero steps (the adapter stopped learning)")
            self.nonzero_grad_seen = self.nonzero_grad_seen or grad_norm != 0
        return found

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        found = self.sign((logs or {}).get("loss"), (logs or {}).get("grad_norm"))
        if found is None or found[0] in self.reported:
            return
        self.reported.add(found[0])
        if state.log_history:  # Trainer appended a copy of ``logs``: record the step where the report reads it
            state.log_history[-1]["divergence_step"] = state.global_step
        message = f"divergence at step {state.global_step}: {found[1]}; lower --learning_rate (or raise --warmup_steps)"
        if self.mode == "stop":
            checkpoint, _ = find_latest_complete_checkpoint(args.output_dir)
            where = f"last complete checkpoint: {checkpoint}" if checkpoint else "no complete checkpoint yet"
            raise DivergenceError(f"{message}; stopped by --on_divergence stop, {where}")
        if state.is_world_process_zero:  # every rank sees the same logged loss: one warning
            logger.warning(f"warning: {message} (--on_divergence stop ends the run here)")
