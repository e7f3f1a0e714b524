"""What the run does on a non-finite or diverging loss, and where it resumes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ReliabilityArguments", "resolve_nan_inf_filter"]


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

    # Trainer's filter reads every micro-batch's loss on the host (a device sync each): resolve_nan_inf_filter.
    logging_nan_inf_filter: bool | None = field(
        default=None,
        metadata={
            "help": "Trainer's filter of NaN/inf losses from the logged loss. Default: on with --on_nonfinite skip "
            "(which reads every loss anyway; the dropped step's loss stays out of the log), off with stop, which "
            "ends the run before such a step's update (the filter would make the host wait for the GPU every step)."
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


def resolve_nan_inf_filter(args: ReliabilityArguments) -> None:
    """``--logging_nan_inf_filter`` by ``--on_nonfinite`` where not given."""
    if args.logging_nan_inf_filter is None:
        args.logging_nan_inf_filter = args.on_nonfinite == "skip"
