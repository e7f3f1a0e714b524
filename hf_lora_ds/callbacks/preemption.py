"""Preemption: on SIGTERM or SIGUSR1, finish the optimizer step, write a complete checkpoint, exit with code 75.

Clusters preempt jobs with SIGTERM, then SIGKILL a few seconds or minutes later; SLURM's ``--signal`` sends SIGUSR1
ahead of a job's time limit. Trainer has no handler, so SIGTERM kills it at once and everything since the last
periodic save is lost. ``PreemptionCallback`` only records the signal in its handler (nothing else is safe inside
one); at the end of every optimizer step all ranks agree, through one all-reduce, whether any rank got it, so they
save the same step even when the signal reaches them at slightly different times. Trainer then writes
``checkpoint-N`` and ``CheckpointCompletionCallback`` its completion marker, which ``--resume_from_checkpoint auto``
trusts; run_sft exits with ``PREEMPTED_EXIT_CODE`` (75, ``EX_TEMPFAIL``: "try again") so a job script can requeue.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_lora_ds.distributed import process_group_exists

__all__ = ["PREEMPTED_EXIT_CODE", "PREEMPTION_SIGNALS", "PreemptionCallback"]

PREEMPTED_EXIT_CODE = 75
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionCallback(TrainerCallback):
    """Turn SIGTERM/SIGUSR1 into "save a checkpoint after this step and stop"; ``preempted`` tells the caller."""

    def __init__(self) -> None:
        self.signal_received: int | None = None
        self.preempted = False
        self._previous: dict[int, Any] = {}

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            self._previous = {number: signal.signal(number, self._record) for number in PREEMPTION_SIGNALS}

    def _record(self, number: int, frame: FrameType | None) -> None:
        self.signal_received = number

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self._any_rank_signalled(args.device):
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Put back the handlers training replaced. Also called when training raises (no ``on_train_end`` then):
        a handler left behind would make every later SIGTERM to this process a no-op."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _any_rank_signalled(self, device: torch.device) -> bool:
        """A collective when a process group is up: every rank calls it at the end of every optimizer step. Under
        NCCL that is one device read a step (a preempted run must save at once); one process reads no tensor."""
        if not process_group_exists():
            return self.signal_received is not None
        flag = torch.tensor([int(self.signal_received is not None)], dtype=torch.int32)
        backend = torch.distributed.get_backend()
        flag = flag.to(device if backend != "gloo" else "cpu")
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())
