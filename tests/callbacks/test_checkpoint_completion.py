"""Each checkpoint is marked complete once every rank has written it, listing what Trainer wrote."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from transformers import Trainer, TrainingArguments

from hf_lora_ds.callbacks.checkpoint_completion import CheckpointCompletionCallback
from hf_lora_ds.training.checkpoints import (
    COMPLETE_MARKER,
    find_latest_complete_checkpoint,
    is_complete_checkpoint,
)


def test_trainer_saves_carry_the_marker(tiny_model, tmp_path):
    """With a real Trainer: the marker follows each save and lists the files Trainer wrote, its own included."""
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        save_steps=1,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    ids = torch.randint(3, tiny_model.config.vocab_size, (4, 8), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    Trainer(model=tiny_model, args=args, train_dataset=dataset, callbacks=[CheckpointCompletionCallback()]).train()
    for step in (1, 2):
        checkpoint = tmp_path / f"checkpoint-{step}"
        assert is_complete_checkpoint(checkpoint)
        marker = json.loads((checkpoint / COMPLETE_MARKER).read_text())
        assert marker["global_step"] == step and marker["world_size"] == 1
        assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(marker["files"])
    assert find_latest_complete_checkpoint(tmp_path) == (tmp_path / "checkpoint-2", [])


class Barrier:
    """``distributed_state.wait_for_everyone`` as one rank sees it: records that the rank reached it, and whether
    the checkpoint was marked before every rank had (the other rank may still be writing its part)."""

    def __init__(self, checkpoint):
        self.checkpoint, self.reached = checkpoint, []

    def wait_for_everyone(self):
        self.reached.append((self.checkpoint / COMPLETE_MARKER).exists())


def test_the_marker_is_written_only_after_every_rank_finished(tmp_path):
    """Multi-rank: rank 0 marks the checkpoint after the barrier; the other ranks (should_save False) still meet it,
    or rank 0 would wait for them forever."""
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    for rank, should_save in ((1, False), (0, True)):
        barrier = Barrier(checkpoint)
        args = SimpleNamespace(
            distributed_state=barrier,
            output_dir=str(tmp_path),
            should_save=should_save,
            world_size=2,
            process_index=rank,
        )
        CheckpointCompletionCallback().on_save(args, SimpleNamespace(global_step=3), None)
        assert barrier.reached == [False], f"rank {rank}"
        assert (checkpoint / COMPLETE_MARKER).exists() == should_save
