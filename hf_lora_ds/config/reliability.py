"""What the run does on a non-finite or diverging loss, and where it resumes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ReliabilityArguments"]


@dataclass
class ReliabilityArguments:
    """Guards of a long run."""

    on_nonfinite: Literal["stop", "skip"] = field(
        default="stop",
        metadata={
            "help": "A NaN or infinite training loss or gradient norm: 'stop' the run before its update, naming the "
            "step, the samples of the batch and the last complete checkpoint; or 'skip' the step (no update from "
            "that batch on any rank) and go on, counting skips as nonfinite_skipped in the training logs."
        },
    )

    on_divergence: Literal["warn", "stop"] = field(
        default="warn",
        metadata={
            "help": "A training loss over 3x its running median, or a gradient norm of exactly 0 after non-zero "
            "ones (a finite run diverging, hf_lora_ds.callbacks.divergence): 'warn' prints one line with the step, "
            "'stop' ends the run there (exit code 2). The step is recorded as divergence_step in the training logs."
        },
    )

    # Redeclared only for its help text: run_sft and LoraSFTTrainer.train resolve "auto" (training.checkpoints).
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint-N directory to resume from, or 'auto' for the latest checkpoint in --output_dir "
            "that every rank finished writing (a fresh start when there is none)."
        },
    )
