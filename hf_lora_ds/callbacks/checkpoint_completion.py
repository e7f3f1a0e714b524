"""Each checkpoint marked complete once every rank has written it, for ``--resume_from_checkpoint auto``
(hf_lora_ds.training.checkpoints says why Trainer's own checkpoints cannot be trusted after a kill).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_lora_ds.training.checkpoints import mark_checkpoint_complete, save_failures

__all__ = ["CheckpointCompletionCallback"]


class CheckpointCompletionCallback(TrainerCallback):
    """Mark each checkpoint complete once every rank has finished writing it. Add it after any callback whose
    ``on_save`` must run before the checkpoint counts as complete."""

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # Every rank writes its own shards and RNG state; only after all have returned is the checkpoint whole.
        args.distributed_state.wait_for_everyone()
        checkpoint = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if args.should_save and checkpoint.is_dir():
            with save_failures(checkpoint, args.output_dir):
                mark_checkpoint_complete(checkpoint, state.global_step, args.world_size)
